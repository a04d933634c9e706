"""Someone who can reach a rank's listener and knows roce's wire format, as
csrc/runtime/hello.hpp and process_links.cpp define it: the hellos and
process-link records an attacker would forge, signed with the job secret
(an insider) or another (a stranger). tests/hostile_workers.py attacks with
them, benchmarks/hostile_cost.py measures what each attack costs."""
import hashlib
import hmac
import socket
import struct

HELLO = struct.Struct("<IHHiiQQ")      # magic, version, kind, src, dst, srcNonce, dstNonce
RECORD = struct.Struct("<IHHiIQQ")     # magic, type, len, srcRank, reserved, dstNonce, srcNonce
HELLO_MAGIC, HELLO_VERSION, KIND_PROCESS = 0x526F4345, 7, 5
JOB_SECRET = "hostile-peers-test-secret"
MAC_BYTES = 16  # HMAC-SHA256 of the head under the job secret, truncated (common/job_secret.hpp)
PROCESS_LINKS_KEY = 0x70726F636C696E6B  # "proclink"
LINK_MAGIC, BYE, FAIL, STATE, IDENTITY, GONE, REFUSED = 0x4C494E4B, 2, 3, 4, 0x100, 0x102, 0x103
MAX_TEXT = 4096


def signed(head, secret=JOB_SECRET):
    return head + hmac.new(secret.encode(), head, hashlib.sha256).digest()[:MAC_BYTES]


def record(kind, text=b"", src_rank=-1, dst_nonce=0, src_nonce=0, secret=JOB_SECRET):
    """A process-link record: its head, its text, and the MAC of both."""
    return signed(RECORD.pack(LINK_MAGIC, kind, len(text), src_rank, 0, dst_nonce, src_nonce) + text, secret)


def process_link(port, name=b"stranger/127.0.0.1:1", secret=JOB_SECRET, source="127.0.0.1"):
    """A process link to this rank's listener from `source`; `name`: the
    process key it claims (None: it names none; a key must name an address
    it may come from: this machine's, over loopback); `secret`: what it
    signs its hello with."""
    s = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
    s.sendall(signed(HELLO.pack(HELLO_MAGIC, HELLO_VERSION, KIND_PROCESS, -1, 0, 0, PROCESS_LINKS_KEY), secret))
    if name is not None:
        s.sendall(record(IDENTITY, name, secret=secret))
    return s


def data_hello(version=HELLO_VERSION, secret=JOB_SECRET):
    """The hello of a data connection for a made-up group's nonce; signed
    unless `secret` is None (as versions before the job secret sent it)."""
    head = HELLO.pack(HELLO_MAGIC, version, 1, 1, 0, 1, 2)
    return head if secret is None else signed(head, secret)


def flood(port, groups, megabytes, text_bytes, secret=JOB_SECRET):
    """A process link naming a made-up process, then records with texts of
    `text_bytes` for `groups` nonces nobody created, from ever new senders:
    the records a group keeps until it is created (BYE and FAIL were kept
    without limit). Sent until the bytes are out or the rank closes the
    link; returns the bytes sent."""
    text = b"x" * text_bytes
    sent = 0
    with process_link(port, secret=secret) as s:
        batch, sender = [], 0
        while sent < megabytes << 20:
            for kind in (BYE, FAIL, STATE):
                nonce = 0x5EED0000 + sender % groups
                batch.append(record(kind, text, sender, nonce, sender, secret))
            sender += 1
            if len(batch) >= 64:
                chunk = b"".join(batch)
                try:
                    s.sendall(chunk)
                except OSError:  # closed by the rank
                    return sent
                sent += len(chunk)
                batch = []
    return sent


def refusal(sock):
    """The text of the refusal record a rank sends before closing a link
    whose name it refused (b"" if it closed without one)."""
    sock.settimeout(10)
    data = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    if len(data) < RECORD.size:
        return b""
    magic, kind, length = RECORD.unpack_from(data)[:3]
    return data[RECORD.size:RECORD.size + length] if magic == LINK_MAGIC and kind == REFUSED else b""
