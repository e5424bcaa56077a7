#!/usr/bin/env python3
"""How fast one core seals and opens the TCP transport's records: AES-256-GCM as ringdist
calls it (csrc/common/crypto.cc) and ChaCha20-Poly1305 for comparison, per record size, with
memcpy as the floor (seal_speed.cc, built here against OpenSSL's libcrypto).

    python benchmarks/seal_speed.py --records 16K 64K 256K --json out.json
"""
import argparse
import json
import os
import subprocess
import tempfile

from bench_common import machine_info, write_json
from sweep import parse_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", nargs="+", default=["16K", "64K", "256K"])
    p.add_argument("--json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "seal_speed")
        subprocess.run(["g++", "-O2", "-std=c++17", f"-I{REPO}", os.path.join(HERE, "seal_speed.cc"),
                        os.path.join(REPO, "csrc/common/crypto.cc"), "-lcrypto", "-o", exe],
                       check=True)
        out = subprocess.run([exe, *[str(parse_bytes(r)) for r in args.records]], check=True,
                             capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    print(f"{'cipher':<20} {'op':<5} {'record':>8} {'GB/s':>7}")
    for r in rows:
        print(f"{r['cipher']:<20} {r['op']:<5} {r['record_bytes']:>8} {r['GBps']:>7.2f}")
    if args.json:
        write_json(args.json, {"machine": machine_info(), "rows": rows})


if __name__ == "__main__":
    main()
