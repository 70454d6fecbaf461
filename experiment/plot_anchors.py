"""The published marks our curves and tables are set beside, each with its source and scale.

No baselines counterpart: what the PyTorch port of baselines HER, baselines issue 591 and
baselines' her/README.md report, as read here (ANCHORS), where a mark stands on each axis
(anchor_x), how it is named (anchor_label, anchors_cell), and the epochs at which the port's
FetchPush median curve first reaches 0.5, 0.75 and 0.9 (PORT_FETCHPUSH_EPOCHS_AT), traced off
its figure, for the gap at equal episodes that plot_tables.py computes.

Test: `python -m pytest -q tests/test_plot_bench.py tests/test_docs.py`.
"""


# Published test success rates, (source, ranks, envs, variant, n, success): "success after n
# epochs" of that ranks x envs, marked only beside our runs of that run_variant. The sources:
#   "port": TianhongDai/hindsight-experience-replay, a PyTorch port of baselines HER, read off
#     its README's figure (figures/results.png; median over 5 seeds; x read as epochs run); its
#     commands run FetchPush and FetchSlide at 8 ranks, FetchPickAndPlace at 16, 2 envs a rank;
#   "issue 591": baselines issue #591, a maintainer's one run (`--num_cpu 19`, 2 envs a rank):
#     its log's test/success_rate 0.687 in epoch 8 and 0.895 in epoch 9 (from 0, as ours), and
#     its words "gets to test success rate of 1.0 after 20 epochs";
#   "demos": baselines her/README.md, figure fetchPickAndPlaceContrast (median; no ranks x envs).
# Plappert et al. (2018) give curves only, no value in numbers (Fetch: Fig. 3, HandReach: Fig. 4,
# BlockRotateZ: Appendix C; 19 x 2, 5 seeds), so HandReach and BlockRotateZ have no mark here.
SOURCES = {"port": ("PyTorch port", "5 seeds, median", "x"), "issue 591": ("baselines issue 591",
           "one run", "*"), "demos": ("baselines her/README", "median", "D")}  # name, what, marker
ANCHORS = {
    "FetchPush-v4": [("port", 8, 2, "", 10, 0.3), ("port", 8, 2, "", 20, 0.97),
                     ("issue 591", 19, 2, "", 9, 0.69), ("issue 591", 19, 2, "", 10, 0.89),
                     ("issue 591", 19, 2, "", 20, 1.0)],
    "FetchPickAndPlace-v4": [("port", 16, 2, "", 12, 0.5), ("port", 16, 2, "", 20, 0.76),
                             ("port", 16, 2, "", 48, 0.92),
                             ("demos", None, None, "100 demos", 50, 0.7)],
    "FetchSlide-v4": [("port", 8, 2, "", n, s) for n, s in
                      ((10, 0.1), (20, 0.28), (30, 0.45), (35, 0.5), (50, 0.57), (125, 0.7))],
}
N_CYCLES, T_FETCH = 50, 50  # of the anchors with known ranks x envs: 50 cycles, 50-step episodes
def anchor_x(n_ranks, num_env, epoch, x_key):
    """Where a mark "after `epoch` epochs" goes on x_key's axis: epoch - 1 on the epoch axis (our
    row after that many); None where episodes or env steps lack its ranks x envs, and for hours
    (unstated)."""
    if x_key == "epoch":
        return epoch - 1
    if x_key not in ("episodes", "steps") or n_ranks is None:
        return None
    episodes = epoch * N_CYCLES * n_ranks * num_env
    return episodes if x_key == "episodes" else episodes * T_FETCH


def anchor_label(source, n_ranks, num_env, variant):
    """A mark's legend label: its source, its scale and variant where known, what it is."""
    name, what, _ = SOURCES[source]
    scale = [f"{n_ranks}x{num_env}"] if n_ranks else []
    return f"{', '.join([name] + scale + ([variant] if variant else []))} ({what})"


# The PyTorch port's FetchPush-v1 median (8 x 2, 5 seeds) in its README's figure
# (figures/results.png at commit fff9994 of TianhongDai/hindsight-experience-replay), traced
# pixel by pixel: the axes fitted to the gridlines at epochs 10-40 and success 0.0-1.0 (7.27
# pixels an epoch, 237 pixels from 0 to 1), the median line found by its colour (RGB 76, 114,
# 176) in every pixel column, and the first crossing of each level interpolated linearly
# between columns. Epochs run (x read as epochs run, as for ANCHORS), to 0.1 epoch; the same
# trace reads 0.295 at epoch 10 and 0.983 at 20, beside the marks 0.3 and 0.97 of ANCHORS.
PORT_FETCHPUSH_EPOCHS_AT = {0.5: 11.5, 0.75: 13.5, 0.9: 15.8}


def anchors_cell(env, variant):
    """env's ANCHORS for runs of variant, a clause per source: "PyTorch port, 8x2 (...): ..."."""
    by_label = {}
    for source, n_ranks, num_env, a_variant, epoch, success in ANCHORS.get(env, []):
        if a_variant != variant:
            continue
        label = anchor_label(source, n_ranks, num_env, variant)
        by_label.setdefault(label, []).append(f"{success:.2f} after {epoch}")
    return "; ".join(f"{label}: {', '.join(marks)}" for label, marks in by_label.items()) or "none"
