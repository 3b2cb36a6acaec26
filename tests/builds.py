"""Counting the table builds an op makes (for the build-once tests)."""


def count_builds(monkeypatch):
    """Counting wrappers on the table builders and the longest-path finder:
    entries whose level tables, dense tables and longest paths were made."""
    from semiring_jax._src.core.host import dense_tables, levels, schedule_tables

    counts = {"levels": 0, "dense": 0, "paths": 0}

    def counting(module, name, key, entries=lambda *args, **kwargs: 1):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            counts[key] += entries(*args, **kwargs)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counting(schedule_tables, "build_schedule_arrays", "levels")
    counting(schedule_tables, "build_common", "levels", lambda fsas, *args, **kwargs: len(fsas))
    counting(dense_tables, "build_dense_tables", "dense")
    counting(levels, "path_lengths", "paths")
    return counts
