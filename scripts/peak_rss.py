"""Peak resident memory of a command (its whole process tree), sampled every 0.5 s, and the peak per stage: a
stage is the command's latest output line (specedge export prints one per stage). Two columns: all resident
memory (RSS, which counts the pages of files it maps, such as safetensors checkpoints: the kernel drops those
first when memory runs short) and the memory only the process holds (RssAnon + RssShmem). Dev tool.

    python scripts/peak_rss.py -- specedge export --target SRC --draft none --out BUNDLE
"""

import subprocess
import sys
import threading
import time


def tree_rss_kib(pid: int) -> tuple[int, int]:
    """-> (RSS, RSS less mapped files) of pid and its children, KiB"""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid), "-p", str(pid)], capture_output=True, text=True)
    total = own = 0
    for child in out.stdout.split():
        try:
            fields = dict(line.split(":", 1) for line in open(f"/proc/{child}/status") if ":" in line)
        except OSError:                   # it ended between ps and here
            continue
        kib = {key: int(fields.get(key, "0 kB").split()[0]) for key in ("VmRSS", "RssAnon", "RssShmem")}
        total += kib["VmRSS"]
        own += kib["RssAnon"] + kib["RssShmem"]
    return total, own


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
        now, before = tree_rss_kib(proc.pid), peaks.get(stage[0], (0, 0))
        peaks[stage[0]] = (max(now[0], before[0]), max(now[1], before[1]))
        time.sleep(0.5)
    reader.join()
    print("\npeak per stage (GiB): RSS, RSS less mapped files")
    for name, (rss, own) in peaks.items():
        print(f"  {rss / 2**20:6.2f} {own / 2**20:6.2f}  {name}")
    rss, own = (max((kib[i] for kib in peaks.values()), default=0) / 2**20 for i in (0, 1))
    print(f"peak RSS {rss:.2f} GiB, less mapped files {own:.2f} GiB, exit {proc.returncode}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
