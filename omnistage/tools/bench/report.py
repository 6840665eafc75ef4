"""The figures of ``bench serve``'s levels told: ratios against a baseline, the table, policies compared, a plot."""

from __future__ import annotations

import sys


def add_ratios(levels: dict[int, dict[str, float]], hf: dict[str, float]) -> None:
    """Ratios against HF's best request (its fastest e2e, its best audio s/s), so noise never flatters us."""
    audio = hf.get("best_audio_throughput", hf.get("audio_throughput"))
    e2el = hf.get("min_e2el_ms", hf.get("mean_e2el_ms"))
    for fig in levels.values():
        if audio:
            fig["audio_throughput_ratio_vs_hf"] = fig["audio_throughput"] / audio
        if "mean_audio_ttfp_ms" in fig and e2el:
            fig["ttfp_ratio_vs_hf_e2e"] = fig["mean_audio_ttfp_ms"] / e2el


def print_table(levels: dict[int, dict[str, float]], hf: dict[str, float] | None) -> None:
    head = (f"{'conc':>4} {'ttft p50':>9} {'ttfp p50':>9} {'e2el p50':>9} {'e2el p90':>9} {'e2el p99':>9} "
            f"{'tok/s':>8} {'audio s/s':>9} {'rtf':>6} {'underrun':>9} {'stall ms':>8}")
    if hf:
        head += f" {'audio x hf':>10} {'ttfp/hf e2e':>11}"
    print(head)
    for c, f in levels.items():
        line = (f"{c:>4} {f.get('median_ttft_ms', 0):>9.1f} {f.get('median_audio_ttfp_ms', 0):>9.1f} "
                f"{f.get('p50_e2el_ms', 0):>9.1f} {f.get('p90_e2el_ms', 0):>9.1f} {f.get('p99_e2el_ms', 0):>9.1f} "
                f"{f['output_throughput']:>8.1f} {f['audio_throughput']:>9.3f} {f.get('mean_audio_rtf', 0):>6.2f} "
                f"{int(f['underrun_streams']):>4}/{int(f['audio_streams']):<4} {f.get('mean_underrun_ms', 0):>8.1f}")
        if hf:
            line += (f" {f.get('audio_throughput_ratio_vs_hf', 0):>10.2f} "
                     f"{f.get('ttfp_ratio_vs_hf_e2e', 0):>11.3f}")
        print(line)
        if "server_cpu_s" in f:
            print(f"     server process: {f['server_cpu_s']:.2f} CPU s, {f['server_cpu_s_per_audio_s']:.5f} per audio s "
                  f"({f['total_audio_s']:.1f} audio s)")
        if "cpu_s_per_audio_s" in f:
            stages = ", ".join(f"{stage} {x:.4f}" for stage, x in f["stage_cpu_s_per_audio_s"].items())
            print(f"     CPU s per audio s: {stages}; all {f['cpu_s_per_audio_s']:.4f}, "
                  f"{f['cores_busy']:.2f} cores busy")
    if hf:
        print(f"  hf: {hf['completed']} requests one at a time, e2e mean {hf['mean_e2el_ms']:.1f} ms "
              f"(best {hf['min_e2el_ms']:.1f} ms, best {hf['best_audio_throughput']:.3f} audio s/s; ratios use the best), "
              f"{hf['output_throughput']:.1f} tok/s, {hf['audio_throughput']:.3f} audio s/s "
              f"({hf['mean_audio_s']:.2f} s audio each)"
              + (f", {hf['cpu_s_per_audio_s']:.4f} CPU s per audio s" if "cpu_s_per_audio_s" in hf else ""))


def compare_policies(runs: dict[str, dict[int, dict[str, float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Runs of the same policy (``fifo``, ``fifo#2`` ...) pooled per concurrency: streams that underran, mean
    stall per stream, audio throughput. Alternating policies (fifo,deadline,fifo,deadline) spreads the drift of
    a shared machine over both, so the comparison is of policies rather than of moments."""
    pooled: dict[str, dict[str, dict[str, float]]] = {}
    for name, levels in runs.items():
        policy = name.split("#")[0]
        for c, f in levels.items():
            acc = pooled.setdefault(policy, {}).setdefault(str(c), {"runs": 0, "underrun_streams": 0,
                                                                     "audio_streams": 0, "stall_s": 0.0,
                                                                     "audio_s": 0.0, "wall_s": 0.0})
            acc["runs"] += 1
            acc["underrun_streams"] += f["underrun_streams"]
            acc["audio_streams"] += f["audio_streams"]
            acc["stall_s"] += f.get("total_underrun_s", 0.0)
            acc["audio_s"] += f["total_audio_s"]
            acc["wall_s"] += f["duration_s"]
    for levels in pooled.values():
        for acc in levels.values():
            acc["mean_underrun_ms"] = 1000.0 * acc["stall_s"] / max(acc["audio_streams"], 1)
            acc["audio_throughput"] = acc["audio_s"] / acc["wall_s"] if acc["wall_s"] else 0.0
    print("policies pooled over their runs:")
    for policy, levels in pooled.items():
        for c, acc in levels.items():
            print(f"  {policy:>8} c={c:<3} runs {int(acc['runs'])}: underran {int(acc['underrun_streams'])}/"
                  f"{int(acc['audio_streams'])} streams, mean stall {acc['mean_underrun_ms']:.1f} ms/stream, "
                  f"{acc['audio_throughput']:.3f} audio s/s")
    return pooled


def plot(levels: dict[int, dict[str, float]], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"--plot {path}: matplotlib is not installed (pip install matplotlib); no plot written",
              file=sys.stderr)
        return False
    xs = list(levels)
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("p50_e2el_ms", "e2el p50"), ("p99_e2el_ms", "e2el p99"),
                       ("median_audio_ttfp_ms", "audio ttfp p50"), ("median_ttft_ms", "ttft p50")):
        ax.plot(xs, [levels[c].get(key, float("nan")) for c in xs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(c) for c in xs])  # the levels run, not powers of two
    ax.set_xlabel("concurrency")
    ax.set_ylabel("ms")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return True
