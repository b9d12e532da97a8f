#!/usr/bin/env python3
"""Print the machine code (SASS) NVRTC makes of one kernel unit, without a GPU.

    python3 benches/sass.py moe/experts_mma.cu [--kernel moe_expert_up_mma] [--arch sm_90]

The unit is compiled as routed compiles it (the prelude, the unit's parts, the file; the same
NVRTC options, crates/backend/src/cuda/compile.rs) by the NVRTC of ROUTED_NVRTC_LIB (the
`nvidia-cuda-nvrtc` wheel's libnvrtc.so.13, as .ci/run finds it), and disassembled by the
`nvdisasm` of the `nvidia-cuda-nvdisasm` wheel (pip install nvidia-cuda-nvdisasm). Reading it
shows what the resource check's register counts cannot: whether a kernel's loads leave together or
one after another.
"""

import argparse
import ctypes
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTIONS = ["--std=c++17", "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true"]


def unit_parts(unit):
    """The files of a unit in compile order, from the units! table of source.rs."""
    table = open(os.path.join(REPO, "crates/backend/src/cuda/source.rs")).read()
    parts = dict(re.findall(r'const (\w+): &str = kernel_file!\("([^"]+)"\);', table))
    for path, deps in re.findall(r'\w+ = "([^"]+)" \[([\w, ]*)\];', table):
        if path == unit:
            names = [d.strip() for d in deps.split(",") if d.strip()]
            return [parts["PRELUDE"]] + [parts[n] for n in names] + [path]
    sys.exit(f"no unit {unit} in source.rs")


def cubin(nvrtc, source, arch):
    lib = ctypes.CDLL(nvrtc)
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"unit.cu", 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture={arch}".encode()] + [o.encode() for o in OPTIONS]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    if rc:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(log.value.decode())
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    out = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, out)
    return out.raw


def nvdisasm():
    try:
        import nvidia.cu13 as cu13
    except ImportError:
        sys.exit("no nvdisasm: pip install nvidia-cuda-nvdisasm")
    path = os.path.join(cu13.__path__[0], "bin", "nvdisasm")
    os.chmod(path, 0o755)  # wheels install it without the execute bit
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("unit", help="a unit's path under kernels/, e.g. gemm/gemm.cu")
    ap.add_argument("--kernel", help="print this kernel only")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    nvrtc = os.environ.get("ROUTED_NVRTC_LIB") or sys.exit("set ROUTED_NVRTC_LIB to libnvrtc.so.13")
    source = "".join(open(os.path.join(REPO, "kernels", p)).read() + "\n" for p in unit_parts(args.unit))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin(nvrtc, source, args.arch))
        f.flush()
        text = subprocess.run([nvdisasm(), "-c", f.name], check=True, capture_output=True, text=True).stdout
    if args.kernel:
        # Each function's code is a section `.text.<name>`; keep that one.
        sections = re.split(r"(?m)^(?=//-+ \.text\.)", text)
        text = "".join(s for s in sections if re.match(rf"//-+ \.text\.{re.escape(args.kernel)}\s", s))
        if not text:
            sys.exit(f"no kernel {args.kernel} in {args.unit}")
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
