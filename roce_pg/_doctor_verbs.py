"""What libibverbs itself reports, through ctypes (no torch, no extension): the
device list in libibverbs' order (the order roce tries devices in) and each
port's MTU, state and max_msg_sz, which sysfs does not show. A device that is
in sysfs but not here has no userspace provider (ibverbs-providers missing).
Only stable, exported entry points with the start of struct ibv_port_attr,
into a zeroed buffer larger than the struct."""
import ctypes
from typing import Dict, List, Optional, Tuple

_STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
_LINK_LAYERS = {0: "unspecified", 1: "InfiniBand", 2: "Ethernet"}


class _PortAttr(ctypes.Structure):
    _fields_ = [("state", ctypes.c_int), ("max_mtu", ctypes.c_int), ("active_mtu", ctypes.c_int),
                ("gid_tbl_len", ctypes.c_int), ("port_cap_flags", ctypes.c_uint32),
                ("max_msg_sz", ctypes.c_uint32), ("bad_pkey_cntr", ctypes.c_uint32),
                ("qkey_viol_cntr", ctypes.c_uint32), ("pkey_tbl_len", ctypes.c_uint16),
                ("lid", ctypes.c_uint16), ("sm_lid", ctypes.c_uint16), ("lmc", ctypes.c_uint8),
                ("max_vl_num", ctypes.c_uint8), ("sm_sl", ctypes.c_uint8), ("subnet_timeout", ctypes.c_uint8),
                ("init_type_reply", ctypes.c_uint8), ("active_width", ctypes.c_uint8),
                ("active_speed", ctypes.c_uint8), ("phys_state", ctypes.c_uint8),
                ("link_layer", ctypes.c_uint8), ("flags", ctypes.c_uint8), ("port_cap_flags2", ctypes.c_uint16),
                ("_room", ctypes.c_uint8 * 192)]  # newer rdma-core may write more


def _mtu(enum_value: int) -> Optional[int]:
    return 128 << enum_value if 1 <= enum_value <= 5 else None


def probe(port_numbers: Optional[Dict[str, List[int]]] = None) -> Tuple[Optional[dict], str]:
    """({'order': [device, ...], 'ports': {(device, port): {...}}}, '') or (None, why).
    port_numbers: device -> ports to query (from sysfs); port 1 if unknown."""
    try:
        lib = ctypes.CDLL("libibverbs.so.1", use_errno=True)
    except OSError as e:
        return None, f"libibverbs.so.1 cannot be loaded ({e})"
    lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
    lib.ibv_get_device_list.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.ibv_free_device_list.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.ibv_get_device_name.restype = ctypes.c_char_p
    lib.ibv_get_device_name.argtypes = [ctypes.c_void_p]
    lib.ibv_open_device.restype = ctypes.c_void_p
    lib.ibv_open_device.argtypes = [ctypes.c_void_p]
    lib.ibv_close_device.argtypes = [ctypes.c_void_p]
    lib.ibv_query_port.argtypes = [ctypes.c_void_p, ctypes.c_uint8, ctypes.POINTER(_PortAttr)]

    n = ctypes.c_int(0)
    devs = lib.ibv_get_device_list(ctypes.byref(n))
    if not devs:
        return None, f"ibv_get_device_list failed (errno {ctypes.get_errno()})"
    out = {"order": [], "ports": {}, "open_errors": {}}
    try:
        for i in range(n.value):
            name = lib.ibv_get_device_name(devs[i]).decode()
            out["order"].append(name)
            ctx = lib.ibv_open_device(devs[i])
            if not ctx:
                out["open_errors"][name] = "ibv_open_device failed (permissions on /dev/infiniband?)"
                continue
            try:
                for p in (port_numbers or {}).get(name, [1]):
                    attr = _PortAttr()
                    if lib.ibv_query_port(ctx, p, ctypes.byref(attr)) != 0:
                        continue
                    out["ports"][(name, p)] = {
                        "state": _STATES.get(attr.state, str(attr.state)),
                        "active_mtu": _mtu(attr.active_mtu), "max_mtu": _mtu(attr.max_mtu),
                        "gid_tbl_len": attr.gid_tbl_len, "max_msg_sz": attr.max_msg_sz,
                        "link_layer": _LINK_LAYERS.get(attr.link_layer, str(attr.link_layer)),
                    }
            finally:
                lib.ibv_close_device(ctx)
    finally:
        lib.ibv_free_device_list(devs)
    return out, ""
