"""Writes DIRECTORY/_settings_table.py from a built roce_pg._C: every ROCE_PG_*
setting the extension reads, its accepted values and its declaration, as the
extension itself lists them (settings() and setting_declarations(), i.e.
Config::read in csrc/common/config.cpp). The doctor validates settings with
it without loading the extension. Run by setup.py after each build, and by
scripts/sanitize.sh for its instrumented build; rewrites the file only when
it changed.

    python scripts/settings_table.py PATH/TO/_C.so DIRECTORY
"""
import importlib.util
import os
import pprint
import sys


def render(ext) -> str:
    return ('"""Generated from the built extension by scripts/settings_table.py: the ROCE_PG_*\n'
            'settings Config::read declares (csrc/common/config.cpp), for the doctor."""\n'
            f"SETTINGS = {pprint.pformat(ext.settings(), width=120, sort_dicts=False)}\n"
            f"DECLARATIONS = {pprint.pformat(ext.setting_declarations(), width=120, sort_dicts=False)}\n")


def main():
    so_path, directory = sys.argv[1], sys.argv[2]
    import torch  # noqa: F401  (the extension's libraries)

    spec = importlib.util.spec_from_file_location("roce_pg._C", so_path)
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    text = render(ext)
    path = os.path.join(directory, "_settings_table.py")
    if os.path.exists(path) and open(path).read() == text:
        return
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
