"""What the row families (reduce, softmax, norm, cross-entropy) share: `tiling` (the
host-side arithmetic of their configs) and `split` (rows that do not start on 16 bytes,
realigned at run time)."""
