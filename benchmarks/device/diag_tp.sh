export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/src:/tmp/site
C="--set data.source=synthetic-text --set model.init=random --set model.shape=tiny --set device=cuda --set data.num_workers=0 --set data.max_length=64 --set data.batch_size=4 --set train.max_steps=4 --set train.warmup_steps=1 --set log.progress=false --set train.lr=0.01"
run() { n=$1; shift; timeout 60 python3 -m paratrain run $C "$@" --output-dir /tmp/d_$n > /tmp/d_$n.log 2>&1 || { echo "$n FAILED"; grep -E "Error|error" /tmp/d_$n.log | grep -v Warn | tail -3; }; }
run a --set lora.enabled=false
run b --set lora.enabled=false --set model.loss_chunk_tokens=4096
run c --set lora.enabled=false --set strategy=tp --set parallel.loss_parallel=false
run d --set lora.enabled=false --set strategy=tp
run e --set strategy=tp --set train.optimizer=sgd --set checkpoint.every_steps=2
run f --set lora.enabled=false --set strategy=tp --set train.optimizer=sgd --set checkpoint.every_steps=2
cd tests && python3 -c "
from conftest import final_weights, max_abs_diff
a = final_weights('/tmp/d_a')
for n in 'bcd':
    try: print(n, max_abs_diff(a, final_weights('/tmp/d_' + n)))
    except Exception as e: print(n, repr(e)[:200])
for n in 'ef':
    try: final_weights('/tmp/d_' + n); print(n, 'ok')
    except Exception as e: print(n, repr(e)[:200])
"
