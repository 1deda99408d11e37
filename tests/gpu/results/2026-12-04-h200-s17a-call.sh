set -u
ROOT=$(pwd); RES=$OUT/results; mkdir -p $RES
mkdir -p .kbuild && tar -C .kbuild -xJf .kbz/kbuild.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/rigllm-site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/rigllm-site:$ROOT RIGLLM_KERNEL_DIR=$ROOT/.kbuild PYTHONDONTWRITEBYTECODE=1 RIGLLM_COMMIT=d079f7d
export OMP_NUM_THREADS=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
(timeout 200 python3 -m pytest -o addopts='' -q -rfE -n 14 --timeout 150 -p no:benchmark tests/gpu/test_gemv.py tests/gpu/test_gemm.py tests/gpu/test_embedding.py > $RES/kernel-tests.log 2>&1; echo "tests rc=$?" >> $RES/kernel-tests.log)
tail -3 $RES/kernel-tests.log
timeout 150 python3 probe_s17.py $RES/prefetch-probe.json > $RES/prefetch-probe.log 2>&1; echo "probe rc=$?"
for r in 1 2; do
 timeout 60 python3 -m engine.cli bench --synthetic 9b --weights q8_0 --prompts 512 --depths 512 --json $RES/bench-9b-r$r.json > $RES/bench-9b-r$r.log 2>&1; echo "bench9b r$r rc=$? $SECONDS s"
done
timeout 120 python3 -m engine.cli bench --synthetic 27b --weights q8_0 --prompts 512 --depths 512 --json $RES/bench-27b.json > $RES/bench-27b.log 2>&1; echo "bench27b rc=$? $SECONDS s"
cat $RES/prefetch-probe.log | tail -45
for f in $RES/bench-*.json; do python3 -c "
import json,sys; d=json.load(open('$f')); s=d['concurrent_streams']['streams']; one=s['1']['tokens_per_s']
print('$f'.split('/')[-1], 'decode', round(d['decode']['512']['tokens_per_s'],1), round(d['decode']['512']['fraction_of_read_ceiling'],3), 'streams', [round(s[k]['tokens_per_s']) for k in s], 'x8', round(s['8']['tokens_per_s']/one,3), 'step', round(d['decode_kernel_breakdown']['whole_us']))
"; done
cd $OUT && tar czf results.tgz results && rm -rf results
