/**
 * The rendezvous key-value store of a data-parallel job (the role of PyTorch's `TCPStore`): rank 0
 * serves it ({@link TcpStoreServer}), every rank (rank 0 included) connects to it as a client
 * ({@link TcpStore}) to publish and read what the ranks must exchange before they can talk directly
 * (the NCCL unique id, Gloo's addresses) and to count arrivals.
 *
 * Everything here is synchronous: the server runs on a native thread of its own, so rank 0 can
 * serve and be a client on the same JavaScript thread, and every blocking call has a deadline.
 * Clients must present the job's token (the launcher's `RESNET_STORE_TOKEN`); a connection that
 * does not is closed before it can read or write a key. The store listens only on the address it is
 * given; do not expose its port beyond the cluster's network.
 * @packageDocumentation
 */
import { addon, type RawTcpStore, type RawTcpStoreServer } from '../binding.js';
import { ResnetError, expectInt, expectNumber, expectOptions, invalid } from '../errors.js';

/** The store's default timeout in seconds (PyTorch's `TCPStore` default, 300 s). */
export const DEFAULT_STORE_TIMEOUT_SECONDS = 300;

/** Options of {@link TcpStoreServer}. */
export interface TcpStoreServerOptions {
  /** The address (or host name) to listen on, e.g. `MASTER_ADDR`; only that address is bound. */
  host: string;
  /** The port, e.g. `MASTER_PORT`; 0 (the default) picks a free one, read back from `port`. */
  port?: number;
  /** The job's token that clients must present; empty (the default) accepts any client. */
  token?: string;
}

/** Options of {@link TcpStore}. */
export interface TcpStoreOptions {
  /** The host rank 0 serves the store on (`MASTER_ADDR`). */
  host: string;
  /** Its port (`MASTER_PORT`). */
  port: number;
  /** The job's token (`RESNET_STORE_TOKEN`); default empty. */
  token?: string;
  /** This process's rank, which the store reports if the process disappears. */
  rank: number;
  /**
   * How long connecting (rank 0 may start later) and each `get`, `add`, `set`, `check` may take,
   * and the default of `wait`; default 300 s.
   */
  timeoutSeconds?: number;
}

/** What a key-value store offers the ranks: {@link TcpStore}, or a {@link PrefixStore} view of it. */
export interface KeyValueStore {
  /** Stores `value` (bytes, or a string stored as UTF-8) under `key`, replacing any earlier value. */
  set(key: string, value: Uint8Array | string): void;
  /** The value of `key`, waiting until some rank sets it (up to the store's timeout). */
  get(key: string): Uint8Array;
  /** {@link KeyValueStore.get}, decoded as UTF-8. */
  getString(key: string): string;
  /** Adds `delta` to the integer at `key` (0 when absent, stored as decimal text) and returns the sum. */
  add(key: string, delta?: number): number;
  /** Waits until every key exists; throws naming the missing keys after the timeout. */
  wait(keys: string | readonly string[], timeoutSeconds?: number): void;
  /** Whether every key exists now (does not wait). */
  check(keys: string | readonly string[]): boolean;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function expectHost(value: unknown): string {
  if (typeof value !== 'string' || value.length === 0) invalid('host', 'a non-empty address or host name', value);
  return value;
}

function expectToken(value: unknown): string {
  if (value === undefined) return '';
  if (typeof value !== 'string') invalid('token', 'a string (the job token)', value);
  return value;
}

function expectKey(name: string, value: unknown): string {
  if (typeof value !== 'string' || value.length === 0) invalid(name, 'a non-empty string key', value);
  return value;
}

function expectKeys(value: unknown): string[] {
  if (typeof value === 'string') return [expectKey('keys', value)];
  if (!Array.isArray(value)) invalid('keys', 'a key or an array of keys', value);
  return value.map((key, i) => expectKey(`keys[${i}]`, key));
}

function expectValue(value: unknown): Uint8Array {
  if (typeof value === 'string') return encoder.encode(value);
  if (value instanceof Uint8Array) return value;
  return invalid('value', 'a Uint8Array or a string', value);
}

/**
 * Rank 0's store server, listening on `host:port` and answering on a native thread until
 * {@link TcpStoreServer.close}. Throws `ERR_RC_INVALID_ARGUMENT` when `host` is not an address of
 * this machine and `ERR_RC_DISTRIBUTED` when the port is taken.
 */
export class TcpStoreServer {
  /** The address it listens on. */
  readonly host: string;
  /** The port it listens on (the chosen one when 0 was asked). */
  readonly port: number;
  #raw: RawTcpStoreServer | null;

  constructor(options: TcpStoreServerOptions) {
    const o = expectOptions<TcpStoreServerOptions>('TcpStoreServer options', options, ['host', 'port', 'token']);
    this.host = expectHost(o.host);
    const port = expectInt('port', o.port ?? 0, 0, 65535);
    this.#raw = new (addon().TcpStoreServer)({ host: this.host, port, token: expectToken(o.token) });
    this.port = this.#raw.port;
  }

  /** Whether it still serves. */
  get closed(): boolean {
    return this.#raw === null;
  }

  /** Stops serving and closes every client's connection; a second call does nothing. */
  close(): void {
    this.#raw?.close();
    this.#raw = null;
  }

  /** {@link TcpStoreServer.close}, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }
}

/**
 * A client of the store (torch.distributed's `TCPStore` with `is_master=False`). Connecting retries
 * until the timeout, since rank 0 may start later; then throws `ERR_RC_DISTRIBUTED` naming
 * `host:port`. Every call blocks the calling thread up to its deadline.
 */
export class TcpStore implements KeyValueStore {
  /** The store's host. */
  readonly host: string;
  /** The store's port. */
  readonly port: number;
  /** This client's rank. */
  readonly rank: number;
  /** Seconds each call may take (and `wait`'s default). */
  readonly timeoutSeconds: number;
  #raw: RawTcpStore | null;

  constructor(options: TcpStoreOptions) {
    const o = expectOptions<TcpStoreOptions>('TcpStore options', options, [
      'host',
      'port',
      'token',
      'rank',
      'timeoutSeconds',
    ]);
    this.host = expectHost(o.host);
    this.port = expectInt('port', o.port, 1, 65535);
    this.rank = expectInt('rank', o.rank, 0, 2 ** 31 - 1);
    this.timeoutSeconds = expectNumber('timeoutSeconds', o.timeoutSeconds ?? DEFAULT_STORE_TIMEOUT_SECONDS, 1e-3, 1e7);
    this.#raw = new (addon().TcpStore)({
      host: this.host,
      port: this.port,
      token: expectToken(o.token),
      rank: this.rank,
      timeoutSeconds: this.timeoutSeconds,
    });
  }

  /** The native client, for native code that uses the same connection (a communicator). @internal */
  get raw(): RawTcpStore {
    if (this.#raw === null) throw new ResnetError('ERR_RC_DISPOSED', 'This TcpStore was closed and cannot be used');
    return this.#raw;
  }

  /** Whether {@link TcpStore.close} was called. */
  get closed(): boolean {
    return this.#raw === null;
  }

  /** {@inheritDoc KeyValueStore.set} */
  set(key: string, value: Uint8Array | string): void {
    this.raw.set({ key: expectKey('key', key), value: expectValue(value) });
  }

  /** {@inheritDoc KeyValueStore.get} */
  get(key: string): Uint8Array {
    return this.raw.get({ key: expectKey('key', key) });
  }

  /** {@inheritDoc KeyValueStore.getString} */
  getString(key: string): string {
    return decoder.decode(this.get(key));
  }

  /** {@inheritDoc KeyValueStore.add} */
  add(key: string, delta = 1): number {
    return this.raw.add({
      key: expectKey('key', key),
      delta: expectInt('delta', delta, Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER),
    });
  }

  /** {@inheritDoc KeyValueStore.wait} */
  wait(keys: string | readonly string[], timeoutSeconds = this.timeoutSeconds): void {
    this.raw.wait({
      keys: expectKeys(keys),
      timeoutSeconds: expectNumber('timeoutSeconds', timeoutSeconds, 1e-3, 1e7),
    });
  }

  /** {@inheritDoc KeyValueStore.check} */
  check(keys: string | readonly string[]): boolean {
    return this.raw.check({ keys: expectKeys(keys) });
  }

  /**
   * The ranks whose connection to the store closed without {@link TcpStore.close} (a process that
   * died or lost its network), ascending: what a rank that times out waiting for peers reports.
   */
  lostRanks(): number[] {
    return this.raw.lostRanks();
  }

  /** Leaves the store on purpose (this rank is not reported lost); a second call does nothing. */
  close(): void {
    this.#raw?.close();
    this.#raw = null;
  }

  /** {@link TcpStore.close}, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }
}

/**
 * A view of a store whose keys all start with `prefix` + `/` (torch.distributed's `PrefixStore`), so
 * that several groups or rendezvous rounds share one store without their keys meeting.
 */
export class PrefixStore implements KeyValueStore {
  /** The prefix, without the separator. */
  readonly prefix: string;
  readonly #store: KeyValueStore;

  constructor(prefix: string, store: KeyValueStore) {
    this.prefix = expectKey('prefix', prefix);
    if (typeof store !== 'object' || store === null || typeof store.get !== 'function') {
      invalid('store', 'a TcpStore or another KeyValueStore', store);
    }
    this.#store = store;
  }

  #key(key: string): string {
    return `${this.prefix}/${expectKey('key', key)}`;
  }

  /** {@inheritDoc KeyValueStore.set} */
  set(key: string, value: Uint8Array | string): void {
    this.#store.set(this.#key(key), value);
  }

  /** {@inheritDoc KeyValueStore.get} */
  get(key: string): Uint8Array {
    return this.#store.get(this.#key(key));
  }

  /** {@inheritDoc KeyValueStore.getString} */
  getString(key: string): string {
    return this.#store.getString(this.#key(key));
  }

  /** {@inheritDoc KeyValueStore.add} */
  add(key: string, delta = 1): number {
    return this.#store.add(this.#key(key), delta);
  }

  /** {@inheritDoc KeyValueStore.wait} */
  wait(keys: string | readonly string[], timeoutSeconds?: number): void {
    this.#store.wait(
      expectKeys(keys).map((k) => this.#key(k)),
      timeoutSeconds,
    );
  }

  /** {@inheritDoc KeyValueStore.check} */
  check(keys: string | readonly string[]): boolean {
    return this.#store.check(expectKeys(keys).map((k) => this.#key(k)));
  }
}
