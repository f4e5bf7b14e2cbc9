/**
 * A rank of the store tests: connects to the store named by the torchrun variables with the job's
 * token and does what its first argument says.
 *   set <key> <value> <delayMs>  waits `delayMs`, sets the key, closes the client and exits
 *   hold                         sets `ready/<rank>` and waits to be killed (never closes)
 * @packageDocumentation
 */
import { TcpStore } from '../../lib/distributed/store.js';

function env(name: string): string {
  const value = process.env[name];
  if (value === undefined) throw new Error(`${name} is not set`);
  return value;
}

const store = new TcpStore({
  host: env('MASTER_ADDR'),
  port: Number(env('MASTER_PORT')),
  token: env('RESNET_STORE_TOKEN'),
  rank: Number(env('RANK')),
  timeoutSeconds: 30,
});
const [mode, ...args] = process.argv.slice(2);
if (mode === 'set') {
  const [key = '', value = '', delayMs = '0'] = args;
  await new Promise((done) => setTimeout(done, Number(delayMs)));
  store.set(key, value);
  store.close();
} else if (mode === 'hold') {
  store.set(`ready/${store.rank}`, String(process.pid));
  // Waits to be killed: the store must report this rank lost, since it never says goodbye. The
  // timer holds the client: one the garbage collector finalizes says goodbye and closes, as a
  // rank that leaves on purpose does, which would hide the kill.
  setInterval(() => store.rank, 1000);
} else {
  throw new Error(`unknown mode ${mode}`);
}
