"""What the row families (reduce, softmax, norm, cross-entropy) share: `tiling` (the
host-side arithmetic of their configs, the `RowTiling` mixin), `grid` (where a thread
stands in the row grid), `partials` (a row's partials over its warps and cluster CTAs,
posted to shared memory and folded), `staging` (rows brought into shared memory by bulk
copies) and `split` (rows that do not start on 16 bytes, realigned at run time)."""
