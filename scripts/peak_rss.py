"""Peak resident memory of a command (its whole process tree), sampled every 0.5 s, and the peak per stage: a
stage is the command's latest output line (specedge export prints one per stage). Dev tool.

    python scripts/peak_rss.py -- specedge export --target SRC --draft none --out BUNDLE
"""

import subprocess
import sys
import threading
import time


def tree_rss_kib(pid: int) -> int:
    out = subprocess.run(["ps", "-o", "rss=", "--ppid", str(pid), "-p", str(pid)], capture_output=True, text=True)
    return sum(int(x) for x in out.stdout.split())


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    stage, peaks = ["(start)"], {}

    def read():
        for line in proc.stdout:
            sys.stdout.write(line)
            if line.strip() and "it/s" not in line:          # progress bars are not stages
                stage[0] = line.strip()[:100]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while proc.poll() is None:
        peaks[stage[0]] = max(peaks.get(stage[0], 0), tree_rss_kib(proc.pid))
        time.sleep(0.5)
    reader.join()
    print("\npeak RSS per stage (GiB):")
    for name, kib in peaks.items():
        print(f"  {kib / 2**20:6.2f}  {name}")
    print(f"peak RSS {max(peaks.values(), default=0) / 2**20:.2f} GiB, exit {proc.returncode}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
