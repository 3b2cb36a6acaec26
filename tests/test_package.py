"""The public surface: API.md's names (as far as built), each documented."""

import inspect

import semiring_jax as sj

# API.md's names, by the issue that builds them. Names of later issues are
# added to __all__ as they land; until then they must not exist as stubs.
CORE = {
    "Fsa",
    "LOG",
    "TROPICAL",
    "Semiring",
    "semiring",
    "linear_fsa",
    "stack",
    "unstack",
    "tot_score",
    "forward_scores",
    "backward_scores",
    "arc_posteriors",
    "best_path",
}
DENSE = {
    "dense_tot_score",
    "intersect_dense",
    "ctc_loss",
    "ctc_topo",
    "ctc_graph",
    "forced_align",
    "viterbi_decode",
}
TRANSDUCER = {
    "rnnt_loss",
    "rnnt_align",
    "rnnt_loss_simple",
    "rnnt_loss_smoothed",
    "rnnt_prune_ranges",
    "rnnt_prune",
    "rnnt_loss_pruned",
}
ALGORITHMS = {
    "intersect",
    "compose",
    "connect",
    "top_sort",
    "arc_sort",
    "invert",
    "project",
    "union",
    "concat",
    "closure",
    "reverse",
    "prune",
    "remove_epsilon",
    "determinize",
}
# Issue 14 (LF-MMI): the loss and the builders of its graphs.
MMI = {"mmi_loss", "ngram_fsa", "read_arpa", "hmm_topo", "denominator_graph", "numerator_graphs"}
# Issue 5 (ecosystem): symbol tables, files and pictures, beyond API.md.
ECOSYSTEM = {"SymbolTable", "save", "load", "dense_occupancy", "plot_alignment"}
# Decoding: paths out of lattices and their errors.
DECODING = {"intersect_dense_pruned", "nbest", "sample_paths", "edit_distance", "mwer_loss"}
# Semirings with structured weights.
STRUCTURED = {"kbest_scores", "kbest_semiring", "entropy", "kl_divergence", "check_semiring_laws"}
# Which implementation runs where (a module: table, force).
ROUTES = {"routes"}


def test_all_is_the_built_part_of_the_api():
    exported = set(sj.__all__)
    assert (
        exported
        == CORE | DENSE | TRANSDUCER | MMI | ALGORITHMS | ECOSYSTEM | DECODING | STRUCTURED | ROUTES
    )


def test_every_public_name_has_an_example():
    for name in sj.__all__:
        value = getattr(sj, name)
        if name in {"LOG", "TROPICAL"}:
            continue  # instances; their class documents them
        doc = inspect.getdoc(value) or ""
        assert "Examples:" in doc and ">>>" in doc, f"{name} has no runnable example"
    for method in [
        "from_arcs",
        "from_openfst",
        "from_k2",
        "from_pynini",
        "to_openfst",
        "to_k2",
        "to_pynini",
        "to_dot",
        "replace",
    ]:
        assert "Examples:" in inspect.getdoc(getattr(sj.Fsa, method)), method
