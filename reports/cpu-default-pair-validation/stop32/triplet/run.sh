set -e
cd /work/main
B=.venv/bin
cal() { $B/saguaro calibrate --draft-int8 --batch 1 --budget 8 --context 150 --repeats 6 --link-tokens 0 --out /tmp/trip/cal$1.jsonl > /tmp/trip/cal$1.out 2>&1; }
ben() { $B/saguaro bench --systems ssd -K 4 --budget 8 --schedule uniform --backup neural --batch 1 --temperature 0 --prompts reports/cpu-default-pair-validation/prompts.jsonl -n 2 --max-new-tokens 64 --ignore-eos --dtype bfloat16 --draft-int8 --threads 1 --warmup 1 --no-progress --out /tmp/trip/bench$1 --name e > /tmp/trip/bench$1.out 2>&1; }
date -u +%T; cal 1; date -u +%T; ben 1; date -u +%T; cal 2; date -u +%T
