# A/B of a kernel change at several depths (s15e): tests/gpu/depth_streams.py on the base tree (.kbz/base-tree.tar.xz,
# its kernels .kbz/kbuild-base.tar.xz: git archive BASE engine cuda_src) and on this tree (.kbz/kbuild.tar.xz), twice
# each, then the attention and batch GPU tests. On the H200: RIGLLM_BASE_COMMIT=... RIGLLM_COMMIT=... bash tests/gpu/ab_depth.sh
set -u
mkdir -p .kbuild /tmp/base/.kbuild && tar -C .kbuild -xJf .kbz/kbuild.tar.xz && tar -C /tmp/base -xJf .kbz/base-tree.tar.xz \
  && tar -C /tmp/base/.kbuild -xJf .kbz/kbuild-base.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/rigllm-site .whl/*.whl > /dev/null 2>&1
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
R=$OUT/results; mkdir -p $R
for round in 1 2; do
  for side in base new; do
    if [ $side = base ]; then root=/tmp/base; else root=$PWD; fi
    (cd $root && PYTHONPATH=/tmp/rigllm-site:$root RIGLLM_KERNEL_DIR=$root/.kbuild OUT=$OUT/$side$round RIGLLM_COMMIT=$([ $side = base ] && echo ${RIGLLM_BASE_COMMIT:-base} || echo ${RIGLLM_COMMIT:-new}) \
      timeout 150 python3 $OLDPWD/tests/gpu/depth_streams.py 9b 2>&1 | sed "s/^/$side$round /")
  done
done
PYTHONPATH=/tmp/rigllm-site:$PWD RIGLLM_KERNEL_DIR=$PWD/.kbuild timeout 150 python3 -m pytest -o addopts='' -q -rfE -n 14 \
  --timeout 120 tests/gpu/test_attention.py tests/gpu/test_attention_any_group.py tests/gpu/test_slots.py \
  tests/gpu/test_slot_batch.py tests/gpu/test_teeth_batches.py > $R/focus-tests.log 2>&1; tail -3 $R/focus-tests.log
