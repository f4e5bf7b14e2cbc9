/**
 * Rank script for failures in a two-rank Gloo group. `process.argv[2]` picks what rank 1 does:
 * - `kill`: enqueues an all-reduce of 4 MB and kills itself with SIGKILL while it runs;
 * - `stall`: stays alive but never joins the all-reduce (sleeps past the group's timeout);
 * - `absent`: exits at once without joining the group (a missing peer).
 * Rank 0 joins (except for `absent`, where joining is what fails) and all-reduces; it prints
 * `error <ms> <message>` with the time from the all-reduce (or the join) to the error, and exits 3.
 * `process.argv[3]` is the group's timeout in seconds.
 */
import { initProcessGroup, Tensor } from '../../lib/index.js';

const mode = process.argv[2] ?? 'kill';
const timeoutSeconds = Number(process.argv[3] ?? '10');
const rank = Number(process.env.RANK);

function report(start: number, error: unknown): never {
  const message = error instanceof Error ? error.message : String(error);
  process.stdout.write(`error ${Math.round(performance.now() - start)} ${message.replace(/\n/g, ' ')}\n`);
  process.exit(3);
}

if (rank === 1 && mode === 'absent') process.exit(0);
const joining = performance.now();
let group;
try {
  group = initProcessGroup({ backend: 'gloo', timeoutSeconds });
} catch (error) {
  report(joining, error);
}
const t = Tensor.full([1 << 20], 1);
if (rank === 1) {
  if (mode === 'kill') {
    group.allReduce(t);
    process.kill(process.pid, 'SIGKILL');
  }
  // stall: alive, in no collective, past the timeout.
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, (timeoutSeconds + 5) * 1000);
  process.exit(0);
}
const start = performance.now();
try {
  group.allReduce(t);
  group.synchronize();
  group.allReduce(t);
  group.synchronize();
} catch (error) {
  report(start, error);
}
process.stdout.write('no error\n');
group.destroy();
