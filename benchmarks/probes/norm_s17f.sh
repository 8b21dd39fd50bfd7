# LayerNorm bf16 staged forward: pass 3 centring as one FFMA (new) vs FADD + FMUL (old),
# alternating processes A B A B, separate kernel caches, kernel alone, % of copy.
for i in 1 2; do
  for v in new old; do
    if [ $v = old ]; then export CF_PROBE_OLD_CENTRE=1; else unset CF_PROBE_OLD_CENTRE; fi
    CUTEFORGE_CACHE_DIR=/tmp/cfc_$v timeout 150 python benchmarks/bench_norm_staged.py --fwd --ops layer_norm --dtypes bfloat16 \
      --ns 65536,262144 --defaults-only --no-quack --out $OUT/ln-centre-$v-$i.json > $OUT/ln-centre-$v-$i.log 2>&1
    python -c "
import json; d=json.load(open('$OUT/ln-centre-$v-$i.json'))
print('$v $i copy', d['copy_GBps'], [(s['N'], [(r['pct_copy'], r['correct']) for r in s['rows']]) for s in d['shapes']])"
  done
done
