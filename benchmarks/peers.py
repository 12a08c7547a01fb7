"""dp-governor's mechanisms beside pure-ldp and multi-freq-ldpy on Apple's workloads; a table.

Usage: ``python -m benchmarks.peers [--n 10000000] [--peer-n 100000] [--olh-n 10000]``.

The peers do not install beside a current stack (pure-ldp 1.2.0 wants numpy<2 and xxhash<3;
multi-freq-ldpy 0.2.5 wants xxhash<3 and numba), so this creates a virtual environment of their
own (``--venv``, kept between runs) and runs them there as subprocesses of this file in driver
mode (which imports nothing of dp-governor). Every implementation runs in a fresh process, so
its peak RSS (VmHWM) is its own. Workloads (values Zipf(1.1), eps 4):

- emoji-k2048 / emoji-k65536: CMS, m = 1,024, k = 2,048 or 65,536, d = 2,600;
- emoji-hcms-k2048 / emoji-hcms-k65536: the same values through HCMS (pure-ldp's HCMS can run
  at m = 1,024);
- safari: HCMS, m = 32,768, k = 1,024, d = 250,000.

Peers: pure-ldp's ``CMSClient/CMSServer`` (CMS, and HCMS with ``is_hadamard``) and
multi-freq-ldpy's OLH (it has no CMS). Client and server rates are per report (the peers'
APIs are per report; dp-governor's client figure is its batch ``privatize_indices``, its device
path ``privatize_one`` is in the mechanisms benchmark); estimation covers all d candidates.
Error: RMSE and MAPE of the top 50 true values' counts, at the same n for every implementation
(dp-governor also runs at each peer's n); the ratio column divides dp-governor's server rate at
``--n`` (a day's batch for one aggregator) by the peer's. Server rates fold into a sketch whose
pages are already mapped on both sides (a server holds its sketch; a cold sketch also pays the
kernel's page faults). dp-governor's server rate is one thread; the column beside it is the same
fold with ``threads`` = the cores this process may use, and its ratio is given separately. A
peer that cannot run a workload at all gets a row saying why.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

PEER_PACKAGES = [
    "pure-ldp==1.2.0",
    "multi-freq-ldpy==0.2.5",
    "numpy<2",
    "xxhash<3",
    "scikit-learn",
    "statsmodels",
]
WORKLOADS: dict[str, dict[str, Any]] = {
    "emoji-k2048": {"mech": "cms", "k": 2048, "m": 1024, "d": 2600},
    "emoji-k65536": {"mech": "cms", "k": 65536, "m": 1024, "d": 2600},
    "emoji-hcms-k2048": {"mech": "hcms", "k": 2048, "m": 1024, "d": 2600},
    "emoji-hcms-k65536": {"mech": "hcms", "k": 65536, "m": 1024, "d": 2600},
    "safari": {"mech": "hcms", "k": 1024, "m": 32768, "d": 250_000},
}
EPSILON = 4.0
CORES = len(os.sched_getaffinity(0))
# client s, server s, estimate s, estimates, extra figures (dp-governor: its threaded fold)
Run = tuple[float, float, float, np.ndarray, dict[str, float]]


def zipf_data(d: int, n: int, seed: int) -> np.ndarray:
    """``n`` value indices from Zipf(1.1) over ``d`` values (the same in every environment)."""
    p = 1.0 / np.arange(1, d + 1) ** 1.1
    return np.random.default_rng(seed).choice(d, size=n, p=p / p.sum())


def _errors(est: np.ndarray, data: np.ndarray, d: int) -> tuple[float, float]:
    truth = np.bincount(data, minlength=d).astype(np.float64)
    top = np.argsort(-truth, kind="stable")[:50]
    err = est[top] - truth[top]
    return float(np.sqrt(np.mean(err**2))), float(np.mean(np.abs(err) / truth[top]) * 100)


def _peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _ours(w: dict[str, Any], data: np.ndarray) -> Run:
    from dp_governor.mechanisms import CMS, HCMS, HashFamily

    vocab = [f"v{i}" for i in range(w["d"])]
    mech: Any = (CMS if w["mech"] == "cms" else HCMS)(
        epsilon=EPSILON, k=w["k"], m=w["m"], hash_family=HashFamily(3)
    )
    t0 = time.perf_counter()
    reports = mech.privatize_indices(vocab, data, rng=np.random.default_rng(1))
    client = time.perf_counter() - t0
    sketch = mech.sketch().merge(mech.sketch())  # a sketch the server holds: pages mapped
    t1 = time.perf_counter()
    sketch.add(reports)
    t2 = time.perf_counter()
    est = sketch.estimate(vocab).counts
    t3 = time.perf_counter()
    extra = {}
    if w["mech"] == "cms" and CORES > 1:  # the same fold on every core, reported beside
        again = mech.sketch().merge(mech.sketch())
        t4 = time.perf_counter()
        again.add(reports, threads=CORES)
        extra["server_threaded"] = len(data) / (time.perf_counter() - t4)
    return client, t2 - t1, t3 - t2, np.asarray(est), extra


def _pure_ldp(w: dict[str, Any], data: np.ndarray) -> Run:
    from pure_ldp.frequency_oracles.apple_cms import CMSClient, CMSServer

    hadamard = w["mech"] == "hcms"
    server = CMSServer(EPSILON, w["k"], w["m"], is_hadamard=hadamard)
    server.sketch_matrix[...] = 0.0  # warm pages, as for dp-governor's sketch
    client = CMSClient(EPSILON, server.get_hash_funcs(), w["m"], is_hadamard=hadamard)
    t0 = time.perf_counter()
    reports = [client.privatise(int(x)) for x in data]
    t1 = time.perf_counter()
    server.aggregate_all(reports)
    t2 = time.perf_counter()
    est = np.array(server.estimate_all(range(w["d"]), suppress_warnings=True), dtype=np.float64)
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, est, {}


def _olh(w: dict[str, Any], data: np.ndarray) -> Run:
    from multi_freq_ldpy.pure_frequency_oracles.LH import LH_Aggregator_MI, LH_Client

    d = w["d"]
    t0 = time.perf_counter()
    reports = [LH_Client(int(x), d, EPSILON) for x in data]
    t1 = time.perf_counter()
    freq = LH_Aggregator_MI(reports, d, EPSILON)  # aggregation and estimation are one pass
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, 0.0, np.asarray(freq, dtype=np.float64) * len(data), {}


def driver(impl: str, workload: str, n: int, seed: int) -> dict[str, Any]:
    """Run one implementation on one workload in this process; JSON-ready results."""
    w = WORKLOADS[workload]
    data = zipf_data(w["d"], n, seed)
    run = {"dp-governor": _ours, "pure-ldp": _pure_ldp, "multi-freq-ldpy": _olh}[impl]
    client, server, estimate, est, extra = run(w, data)
    rmse, mape = _errors(est, data, w["d"])
    return {
        **extra,
        "client": n / client,
        "server": n / server,
        "estimate": estimate,
        "rmse": rmse,
        "mape": mape,
        "peak": _peak_mib(),
    }


def ensure_venv(venv: Path) -> Path:
    """The peers' virtual environment (created on first use); returns its python."""
    python = venv / "bin" / "python"
    marker = venv / ".dpgov-peers"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES],
            check=True,
        )
        marker.write_text("\n".join(PEER_PACKAGES))
    return python


def _spawn(python: str, impl: str, workload: str, n: int, seed: int, env: dict[str, str]) -> Any:
    proc = subprocess.run(
        [python, "-P", __file__, "--driver", impl, workload, str(n), str(seed)],  # -P: no shadowing
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


SKIPS = {
    ("pure-ldp", "safari"): "HCMS builds scipy.linalg.hadamard(32768): a dense 8 GiB int64"
    " matrix in the client and another in the server, and a 1,024 x 32,768 x 32,768 matmul",
    ("multi-freq-ldpy", "safari"): "OLH aggregation hashes every (report, value) pair in"
    " Python: 2.5e9 xxhash calls at n = 10,000 and d = 250,000 (about 1,000 reports/s at"
    " d = 2,600 measured here)",
}


def main(argv: list[str] | None = None) -> None:
    """Run every implementation on every workload and print one table."""
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--driver":
        _, _, impl_name, workload_name, n_text, seed_text = sys.argv
        print(json.dumps(driver(impl_name, workload_name, int(n_text), int(seed_text))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=float, default=1e7, help="dp-governor's throughput run")
    parser.add_argument("--peer-n", type=float, default=1e5, help="pure-ldp's reports")
    parser.add_argument("--olh-n", type=float, default=1e4, help="multi-freq-ldpy's reports")
    parser.add_argument("--workload", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "dpgov-peers-venv")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    peer_python = str(ensure_venv(args.venv))
    ours_env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    peer_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    print(
        "| workload | implementation | n | client (reports/s) | server (reports/s) |"
        f" server, {CORES} threads | estimate all d (s) | RMSE top 50 | MAPE top 50 |"
        " peak RSS (MiB) | server ratio | ratio, threads |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for workload in args.workload:
        big = _spawn(sys.executable, "dp-governor", workload, int(args.n), args.seed, ours_env)
        rows = [("dp-governor", int(args.n), big)]
        for impl, n in (("pure-ldp", int(args.peer_n)), ("multi-freq-ldpy", int(args.olh_n))):
            if (impl, workload) in SKIPS:
                rows.append((impl, n, {"error": "not run: " + SKIPS[impl, workload]}))
                continue
            rows.append((impl, n, _spawn(peer_python, impl, workload, n, args.seed, peer_env)))
            same_n = _spawn(sys.executable, "dp-governor", workload, n, args.seed, ours_env)
            rows.append(("dp-governor (same n)", n, same_n))
        for impl, n, r in rows:
            if "error" in r:
                print(f"| {workload} | {impl} | {n:,} | {r['error']} | | | | | | | | |")
                continue
            ratio = threaded_ratio = threaded = ""
            if "server_threaded" in r:
                threaded = f"{r['server_threaded']:,.0f}"
            if not impl.startswith("dp-governor") and "server" in big:
                ratio = f"{big['server'] / r['server']:,.0f}x"
                if "server_threaded" in big:
                    threaded_ratio = f"{big['server_threaded'] / r['server']:,.0f}x"
            print(
                f"| {workload} | {impl} | {n:,} | {r['client']:,.0f} | {r['server']:,.0f} |"
                f" {threaded} | {r['estimate']:.2f} | {r['rmse']:,.0f} | {r['mape']:.1f}% |"
                f" {r['peak']:,.0f} | {ratio} | {threaded_ratio} |"
            )


if __name__ == "__main__":
    main()
