#!/usr/bin/env bash
# Proving resume (docs/checkpoints.md "Proving resume"): the demo,
# shortened (32-token sequences, a constant learning rate, a checkpoint every 3
# steps), trained once without a break, then again SIGKILLed at moments a
# seeded generator picks from its progress (after it printed step N, plus a
# random delay), one of them inside a checkpoint write (held open with the
# test-only MF_TEST_CKPT_PAUSE_MS), and resumed with --resume after each kill
# until it finishes. The final weights must be cmp-identical and every step's
# loss the same.
#
#   tools/kill_test.sh      (after `bazel build //:moefit_test`: the test build,
#                            which reads the test-only MF_TEST_CKPT_PAUSE_MS)
#   env: MOEFIT (default bazel-bin/moefit_test), SEED, KILLS (>= 1, default 3),
#        STEPS (default 120), WORK (a scratch directory; default a new one in /tmp),
#        EXTRA (more overrides for both runs, e.g. "backend=cuda memory.device_budget=600MiB")
set -euo pipefail
cd "$(dirname "$0")/.."
MOEFIT=${MOEFIT:-bazel-bin/moefit_test}
SEED=${SEED:-$(( $(date +%s) % 32768 ))}
KILLS=${KILLS:-3}
STEPS=${STEPS:-120}
WORK=${WORK:-$(mktemp -d /tmp/kill_test.XXXXXX)}
[ -x "$MOEFIT" ] || { echo "kill_test: $MOEFIT is not built (bazel build //:moefit_test, the test build)" >&2; exit 2; }
[ "$KILLS" -ge 1 ] || { echo "kill_test: KILLS must be >= 1" >&2; exit 2; }
RANDOM=$SEED
echo "kill_test: seed $SEED, $KILLS kills, $STEPS steps, in $WORK"

corpus=$WORK/corpus.tokens
if [ ! -f "$corpus" ]; then
  for i in $(seq 0 1200); do echo "line $i: the quick brown fox jumps over the lazy dog"; done > "$WORK/corpus.txt"
  "$MOEFIT" data bytes "$WORK/corpus.txt" "$corpus" > /dev/null
fi
args=(train configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.valid=null data.seq_len=32
      train.micro_batch=2 train.warmup=2 train.log_every=1 train.schedule=constant output.checkpoint_every=3
      output.keep_checkpoints=3 "train.steps=$STEPS" "data.train=$corpus")
# shellcheck disable=SC2206
[ -n "${EXTRA:-}" ] && args+=($EXTRA)

rm -rf "$WORK/whole" "$WORK/killed"
"$MOEFIT" "${args[@]}" output.dir="$WORK/whole" > "$WORK/whole.log" 2>&1 \
  || { echo "kill_test: the uninterrupted run failed (see $WORK/whole.log)" >&2; exit 1; }

newest() { # the newest complete checkpoint's step, 0 without one
  local s=0 d
  for d in "$WORK"/killed/checkpoints/step-*/COMPLETE; do
    [ -e "$d" ] && s=$((10#$(basename "$(dirname "$d")" | cut -d- -f2)))
  done
  echo "$s"
}

kills=0 launch=0
while :; do
  launch=$((launch + 1))
  log=$WORK/killed.$launch.log
  resume=(); [ "$(newest)" -gt 0 ] && resume=(--resume)
  pause=(); in_write=0
  if [ "$kills" -eq 1 ]; then pause=(env MF_TEST_CKPT_PAUSE_MS=200); in_write=1; fi # the second kill: inside a write
  "${pause[@]}" "$MOEFIT" "${args[@]}" output.dir="$WORK/killed" "${resume[@]}" > "$log" 2>&1 &
  pid=$!
  if [ "$kills" -lt "$KILLS" ]; then
    from=$(newest)
    target=$(( from + 4 + RANDOM % 12 )) # a checkpoint (every 3 steps) comes before it
    [ "$target" -lt "$STEPS" ] || target=$((STEPS - 1))
    while kill -0 "$pid" 2> /dev/null; do
      if [ "$in_write" = 1 ]; then
        grep -q "MF_TEST_CKPT_PAUSE_MS: pausing" "$log" && break # this launch is inside a write
      elif grep -qE "^step +$target/" "$log" && [ "$(newest)" -gt "$from" ]; then
        # (a checkpoint written beside training, output.checkpoint_async, is
        # complete a step or more after its own: the kill waits for it)
        sleep "0.0$((RANDOM % 10))"
        break
      fi
      sleep 0.01
    done
    kill -KILL "$pid" 2> /dev/null || true
  fi
  rc=0; { wait "$pid"; } 2> /dev/null || rc=$?
  if [ "$rc" -eq 137 ]; then
    kills=$((kills + 1))
    where="after step $target was printed"
    [ "$in_write" = 1 ] && where="inside a checkpoint write: $(sed -n 's/.*MF_TEST_CKPT_PAUSE_MS: pausing [0-9]* ms after //p' "$log" | head -1)"
    echo "kill_test: SIGKILL $kills ($where); newest complete checkpoint: step $(newest)"
    continue
  fi
  [ "$rc" -eq 0 ] || { echo "kill_test: launch $launch exited $rc (see $log)" >&2; exit 1; }
  [ "$kills" -ge "$KILLS" ] && break
  echo "kill_test: launch $launch finished before it was killed: training again" >&2
  rm -rf "$WORK/killed"; launch=0; kills=0
done

losses() { sed -n 's/^{"step":\([0-9]*\),.*"loss":\([^,]*\),.*/\1 \2/p' "$1/metrics.jsonl"; }
if ! cmp "$WORK/whole/final/model.safetensors" "$WORK/killed/final/model.safetensors"; then
  echo "kill_test: DIFFERENT final weights ($kills kills, seed $SEED)"; exit 1
fi
if ! diff <(losses "$WORK/whole") <(losses "$WORK/killed") > "$WORK/losses.diff"; then
  echo "kill_test: DIFFERENT losses ($kills kills, seed $SEED): $WORK/losses.diff"; exit 1
fi
echo "kill_test: identical ($kills kills, seed $SEED; $(losses "$WORK/whole" | wc -l) steps' losses and the final weights)"
