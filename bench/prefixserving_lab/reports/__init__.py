"""The results files of the benchmarks: :mod:`.files` (``NAME.json`` plus ``NAME.md``, table
cells), and one module per benchmark that renders its markdown."""
