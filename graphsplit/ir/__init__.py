"""The program's intermediate representation: the traced graph, its per-node annotations, layouts, the op table and the per-stage Program."""
