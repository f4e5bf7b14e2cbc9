// The rendezvous store: its key-value semantics against a plain Map's, blocking reads across
// processes, timeouts that name what was waited for, token authentication, lost ranks, and a
// server that stray or malicious connections can neither crash nor stall.
import { randomBytes } from 'node:crypto';
import { Socket, connect } from 'node:net';
import { networkInterfaces } from 'node:os';
import { afterEach, describe, expect, it } from 'vitest';
import { PrefixStore, TcpStore, TcpStoreServer } from '../lib/distributed/store.js';
import { freePort, rankScript, runRanks } from './helpers/ranks.js';

const TOKEN = randomBytes(16).toString('hex');

/** Everything a test opened, closed after it. */
const opened: { close(): void }[] = [];
afterEach(() => {
  for (const o of opened.splice(0).reverse()) o.close();
});

function serve(host = '127.0.0.1', token = TOKEN): TcpStoreServer {
  const server = new TcpStoreServer({ host, port: 0, token });
  opened.push(server);
  return server;
}

function client(server: TcpStoreServer, rank: number, timeoutSeconds = 10, token = TOKEN): TcpStore {
  const store = new TcpStore({ host: server.host, port: server.port, token, rank, timeoutSeconds });
  opened.push(store);
  return store;
}

/** The code and message of what `fn` throws. */
function failure(fn: () => unknown): { code: unknown; message: string } {
  try {
    fn();
  } catch (error) {
    const e = error as Error & { code?: unknown };
    return { code: e.code, message: e.message };
  }
  throw new Error('expected a failure');
}

// ---- raw connections (the wire format of native/core/tcp_store.cc) ------------------------------

const OP_HELLO = 1;
const OP_GET = 3;
const MAGIC = 0x52435331;

function frame(op: number, id: number, fields: Buffer): Buffer {
  const head = Buffer.alloc(9);
  head.writeUInt32BE(5 + fields.length, 0);
  head.writeUInt8(op, 4);
  head.writeUInt32BE(id, 5);
  return Buffer.concat([head, fields]);
}

function text(s: string): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(Buffer.byteLength(s), 0);
  return Buffer.concat([b, Buffer.from(s)]);
}

function hello(token: string, rank = 9): Buffer {
  const fields = Buffer.alloc(8);
  fields.writeUInt32BE(MAGIC, 0);
  fields.writeInt32BE(rank, 4);
  return frame(OP_HELLO, 1, Buffer.concat([fields, text(token)]));
}

/** Opens a raw connection, writes `bytes`, and resolves with what came back once the server closed it. */
async function rawExchange(
  port: number,
  bytes: Buffer,
  timeoutMs = 20_000,
): Promise<{ received: Buffer; closed: boolean }> {
  return await new Promise((done, fail) => {
    const socket: Socket = connect({ host: '127.0.0.1', port });
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => {
      socket.destroy();
      done({ received: Buffer.concat(chunks), closed: false });
    }, timeoutMs);
    socket.on('connect', () => socket.write(bytes));
    socket.on('data', (b: Buffer) => chunks.push(b));
    socket.on('error', (e: NodeJS.ErrnoException) => {
      if (e.code !== 'ECONNRESET' && e.code !== 'EPIPE') fail(e);
    });
    socket.on('close', () => {
      clearTimeout(timer);
      done({ received: Buffer.concat(chunks), closed: true });
    });
  });
}

describe('TcpStore', () => {
  it('sets, gets, adds, waits and checks like a map shared by two clients', () => {
    const server = serve();
    expect(server.port).toBeGreaterThan(0);
    const a = client(server, 0);
    const b = client(server, 1);
    const reference = new Map<string, Uint8Array>();
    const bytes = Uint8Array.from([0, 255, 1, 0, 7]);
    a.set('bytes', bytes);
    reference.set('bytes', bytes);
    b.set('text', 'naïve ✓');
    reference.set('text', new TextEncoder().encode('naïve ✓'));
    const large = Uint8Array.from(randomBytes(1 << 20));
    b.set('large', large);
    reference.set('large', large);
    for (const [key, value] of reference) {
      // Buffer.equals: a deep toEqual of a megabyte takes seconds.
      expect(Buffer.from(a.get(key)).equals(value), key).toBe(true);
      expect(Buffer.from(b.get(key)).equals(value), key).toBe(true);
    }
    expect(a.getString('text')).toBe('naïve ✓');
    a.set('text', 'replaced');
    expect(b.getString('text')).toBe('replaced');

    let counter = 0;
    for (const [store, delta] of [
      [a, 3],
      [b, -5],
      [a, 1],
      [b, 1_000_000_007],
    ] as const) {
      counter += delta;
      expect(store.add('counter', delta)).toBe(counter);
    }
    expect(a.add('fresh')).toBe(1);
    expect(b.getString('counter')).toBe(String(counter));
    expect(failure(() => a.add('text', 1))).toMatchObject({
      code: 'ERR_RC_INVALID_ARGUMENT',
      message: expect.stringContaining("key 'text' holds a value that is not a decimal integer") as unknown,
    });

    expect(a.check(['bytes', 'text', 'counter'])).toBe(true);
    expect(a.check(['bytes', 'absent'])).toBe(false);
    expect(b.check('absent')).toBe(false);
    a.wait(['bytes', 'large'], 1);
    b.wait('counter');
    expect(a.lostRanks()).toEqual([]);
  });

  it('keeps the keys of prefixed views apart', () => {
    const server = serve();
    const store = client(server, 0);
    const first = new PrefixStore('group0', store);
    const second = new PrefixStore('group1', store);
    first.set('id', 'one');
    second.set('id', 'two');
    expect(first.getString('id')).toBe('one');
    expect(second.getString('id')).toBe('two');
    expect(store.getString('group0/id')).toBe('one');
    expect(first.add('n', 2)).toBe(2);
    expect(second.check('n')).toBe(false);
    first.wait(['id', 'n']);
  });

  it('blocks a get until a rank in another process sets the key', async () => {
    const server = serve();
    const store = client(server, 0, 60);
    let spawned = (): void => undefined;
    const started = new Promise<void>((d) => (spawned = d));
    const run = runRanks(rankScript('store-rank'), {
      worldSize: 1,
      args: ['set', 'late', 'from rank 1', '300'],
      env: { MASTER_PORT: String(server.port), RESNET_STORE_TOKEN: TOKEN, RANK: '1' },
      timeoutMs: 60_000,
      onSpawn: () => spawned(),
    });
    // runRanks spawns from the event loop, which the synchronous get below would hold up.
    await started;
    expect(store.check('late')).toBe(false);
    // Synchronous: the server answers from its own thread while this one waits.
    expect(store.getString('late')).toBe('from rank 1');
    const [rank] = await run;
    expect(rank).toMatchObject({ code: 0, stderr: '' });
    // It closed its client: leaving on purpose is not being lost.
    expect(store.lostRanks()).toEqual([]);
  });

  it('reports a rank whose process was killed as lost', async () => {
    const server = serve();
    const store = client(server, 0, 60);
    let spawned = (_: number): void => undefined;
    const started = new Promise<number>((d) => (spawned = d));
    const run = runRanks(rankScript('store-rank'), {
      worldSize: 1,
      args: ['hold'],
      env: { MASTER_PORT: String(server.port), RESNET_STORE_TOKEN: TOKEN, RANK: '3' },
      timeoutMs: 60_000,
      onSpawn: (_, pid) => spawned(pid),
    });
    const pid = await started;
    expect(store.getString('ready/3')).toBe(String(pid));
    expect(store.lostRanks()).toEqual([]);
    process.kill(pid, 'SIGKILL');
    const [rank] = await run;
    expect(rank?.signal).toBe('SIGKILL');
    const deadline = Date.now() + 10_000;
    while (store.lostRanks().length === 0 && Date.now() < deadline) await new Promise((d) => setTimeout(d, 20));
    expect(store.lostRanks()).toEqual([3]);
    // A timeout then names the rank that died.
    expect(failure(() => store.wait('never', 0.3)).message).toMatch(/ranks that died or disconnected: 3/);
  });

  it('times out naming the key, and stays usable afterwards', () => {
    const server = serve();
    const a = client(server, 0, 0.3);
    const b = client(server, 1);
    const started = Date.now();
    const get = failure(() => a.get('missing'));
    expect(Date.now() - started).toBeGreaterThanOrEqual(290);
    expect(get.code).toBe('ERR_RC_DISTRIBUTED');
    expect(get.message).toMatch(
      new RegExp(`^timed out after 0\\.3 s waiting for key 'missing' in the store at 127\\.0\\.0\\.1:${server.port}`),
    );
    b.set('present', 'x');
    const wait = failure(() => a.wait(['present', 'missing', 'also missing'], 0.2));
    expect(wait.code).toBe('ERR_RC_DISTRIBUTED');
    expect(wait.message).toMatch(/^timed out after 0\.2 s waiting for key\(s\) 'missing', 'also missing' in the store/);
    // The answers to the abandoned requests, if any come, are not mistaken for later ones.
    b.set('missing', 'now here');
    expect(a.getString('present')).toBe('x');
    expect(a.getString('missing')).toBe('now here');
    a.wait(['present', 'missing']);
  });

  it('refuses a client with the wrong token, which cannot read a key', async () => {
    const server = serve();
    client(server, 0).set('secret', 'unique id');
    const refused = failure(() => client(server, 1, 5, 'not the token'));
    expect(refused.code).toBe('ERR_RC_DISTRIBUTED');
    expect(refused.message).toMatch(
      new RegExp(`the store at 127\\.0\\.0\\.1:${server.port} refused this client's token`),
    );
    expect(failure(() => client(server, 1, 5, '')).message).toMatch(/refused this client's token/);
    // On the wire: a wrong HELLO followed at once by a GET gets a refusal, no value, and a close.
    const get = frame(OP_GET, 2, text('secret'));
    const answer = await rawExchange(server.port, Buffer.concat([hello('not the token'), get]));
    expect(answer.closed).toBe(true);
    expect(answer.received.includes(Buffer.from('unique id'))).toBe(false);
    expect(answer.received.includes(Buffer.from('refused'))).toBe(true);
    // A GET as the first message: closed without an answer.
    expect(await rawExchange(server.port, get)).toEqual({ received: Buffer.alloc(0), closed: true });
    // The right token on the wire works (the test speaks the protocol correctly).
    const ok = await rawExchange(server.port, Buffer.concat([hello(TOKEN), get]), 1000);
    expect(ok.received.includes(Buffer.from('unique id'))).toBe(true);
  });

  it('survives garbage, huge lengths and silent connections while serving the others', async () => {
    const server = serve();
    const store = client(server, 0);
    store.set('k', 'v');
    const huge = Buffer.alloc(8);
    huge.writeUInt32BE(0xffffffff, 0);
    const hugeHello = Buffer.alloc(4);
    hugeHello.writeUInt32BE(64 << 20, 0);
    const silent = connect({ host: '127.0.0.1', port: server.port });
    silent.on('error', () => undefined);
    await new Promise((d) => silent.on('connect', d));
    try {
      const answers = await Promise.all([
        rawExchange(server.port, huge),
        rawExchange(server.port, Buffer.concat([hugeHello, randomBytes(1000)])),
        rawExchange(server.port, randomBytes(4096)),
        rawExchange(server.port, Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n')),
      ]);
      for (const answer of answers) expect(answer).toEqual({ received: Buffer.alloc(0), closed: true });
      // A connection that never speaks holds nothing up.
      expect(store.getString('k')).toBe('v');
      const other = client(server, 1, 5);
      other.set('k2', 'v2');
      expect(store.getString('k2')).toBe('v2');
      // Only authenticated clients count as ranks: none of these is lost.
      expect(store.lostRanks()).toEqual([]);
    } finally {
      silent.destroy();
    }
  });

  it('says so when the store goes away', () => {
    const server = new TcpStoreServer({ host: '127.0.0.1', token: TOKEN });
    const store = client(server, 0, 5);
    store.set('k', 'v');
    server.close();
    const gone = failure(() => store.get('k'));
    expect(gone.code).toBe('ERR_RC_DISTRIBUTED');
    expect(gone.message).toMatch(
      new RegExp(`the store at 127\\.0\\.0\\.1:${server.port} \\(served by rank 0\\) closed the connection`),
    );
    store.close();
    expect(failure(() => store.get('k'))).toMatchObject({ code: 'ERR_RC_DISPOSED' });
    store.close();
    server.close();
  });

  it('names host:port and the timeout when no store answers', async () => {
    const port = await freePort();
    const started = Date.now();
    const none = failure(() => new TcpStore({ host: '127.0.0.1', port, rank: 1, timeoutSeconds: 0.5 }));
    expect(Date.now() - started).toBeGreaterThanOrEqual(450);
    expect(none.code).toBe('ERR_RC_DISTRIBUTED');
    expect(none.message).toMatch(
      new RegExp(
        `^no store answered at 127\\.0\\.0\\.1:${port} within 0\\.5 s; is rank 0 running and MASTER_ADDR/MASTER_PORT right\\?`,
      ),
    );
    const unknown = failure(() => new TcpStore({ host: 'no-such-host.invalid', port, rank: 1, timeoutSeconds: 0.3 }));
    expect(unknown.message).toMatch(/no store answered at no-such-host\.invalid:\d+ within 0\.3 s/);
    expect(unknown.message).toMatch(/cannot resolve host 'no-such-host\.invalid'/);
  });

  it('waits for a store that starts after the client', async () => {
    const port = await freePort();
    const run = runRanks(rankScript('store-rank'), {
      worldSize: 1,
      args: ['set', 'early', 'client first', '0'],
      env: { MASTER_PORT: String(port), RESNET_STORE_TOKEN: TOKEN, RANK: '1' },
      timeoutMs: 60_000,
    });
    // The client is retrying by now (it starts in well under the 30 s it allows itself).
    await new Promise((d) => setTimeout(d, 500));
    const server = new TcpStoreServer({ host: '127.0.0.1', port, token: TOKEN });
    opened.push(server);
    expect(client(server, 0).getString('early')).toBe('client first');
    expect((await run)[0]).toMatchObject({ code: 0 });
  });

  it('rejects bad options naming the parameter', () => {
    const bad = (options: unknown) => failure(() => new TcpStore(options as never));
    expect(bad({ host: '', port: 1, rank: 0 }).message).toMatch(/for host/);
    expect(bad({ host: '127.0.0.1', port: 0, rank: 0 }).message).toMatch(/integer between 1 and 65535 for port/);
    expect(bad({ host: '127.0.0.1', port: 70000, rank: 0 }).message).toMatch(/for port/);
    expect(bad({ host: '127.0.0.1', port: 1.5, rank: 0 }).message).toMatch(/for port/);
    expect(bad({ host: '127.0.0.1', port: 1, rank: -1 }).message).toMatch(/for rank/);
    expect(bad({ host: '127.0.0.1', port: 1, rank: 0, timeoutSeconds: 0 }).message).toMatch(/for timeoutSeconds/);
    expect(bad({ host: '127.0.0.1', port: 1, rank: 0, token: 5 }).message).toMatch(/for token/);
    expect(bad({ host: '127.0.0.1', port: 1, rank: 0, master: true }).message).toMatch(/Unknown option 'master'/);
    expect(failure(() => new TcpStoreServer({ host: '127.0.0.1', port: -1 })).message).toMatch(/for port/);
    expect(failure(() => new TcpStoreServer({ host: 7 } as never)).message).toMatch(/for host/);

    const server = serve();
    const store = client(server, 0);
    expect(failure(() => store.set('', 'x')).message).toMatch(/for key/);
    expect(failure(() => store.set('k', 5 as never)).message).toMatch(/Uint8Array or a string for value/);
    expect(failure(() => store.wait(['k', 3] as never)).message).toMatch(/for keys\[1\]/);
    expect(failure(() => store.add('k', 0.5)).message).toMatch(/for delta/);
    expect(failure(() => store.get('x'.repeat(5000)))).toMatchObject({
      code: 'ERR_RC_INVALID_ARGUMENT',
      message: expect.stringContaining('a store key must have 1 to 4096 bytes') as unknown,
    });
  });

  it('cannot listen on an address of another machine, or on a port in use', () => {
    const local = new Set(
      Object.values(networkInterfaces())
        .flat()
        .map((i) => i?.address),
    );
    const foreign = ['203.0.113.7', '198.51.100.7'].find((a) => !local.has(a));
    if (foreign) {
      const notHere = failure(() => new TcpStoreServer({ host: foreign }));
      expect(notHere.code).toBe('ERR_RC_INVALID_ARGUMENT');
      expect(notHere.message).toMatch(new RegExp(`cannot listen on ${foreign.replaceAll('.', '\\.')}:0`));
    }
    const server = serve();
    const taken = failure(() => new TcpStoreServer({ host: '127.0.0.1', port: server.port }));
    expect(taken.code).toBe('ERR_RC_DISTRIBUTED');
    expect(taken.message).toMatch(
      new RegExp(`cannot listen on 127\\.0\\.0\\.1:${server.port}: Address already in use`),
    );
  });

  // Linux routes all of 127.0.0.0/8 to the loopback interface, so 127.0.0.2 is another local address.
  const otherAddresses = [
    ...(process.platform === 'linux' ? ['127.0.0.2'] : []),
    ...Object.values(networkInterfaces())
      .flat()
      .filter((i) => i?.family === 'IPv4' && !i.internal)
      .map((i) => i?.address ?? ''),
  ];
  it.skipIf(otherAddresses.length === 0)(
    `listens only on the address it was given${otherAddresses.length ? '' : ' (skipped: no second local address here)'}`,
    () => {
      const server = serve('127.0.0.1');
      for (const host of otherAddresses) {
        const refused = failure(
          () => new TcpStore({ host, port: server.port, token: TOKEN, rank: 1, timeoutSeconds: 0.3 }),
        );
        expect(refused.message).toMatch(
          new RegExp(`no store answered at ${host.replaceAll('.', '\\.')}:${server.port}`),
        );
      }
      expect(client(server, 0).check('k')).toBe(false);
    },
  );

  const hasIpv6Loopback = Object.values(networkInterfaces())
    .flat()
    .some((i) => i?.address === '::1');
  it.skipIf(!hasIpv6Loopback)(`serves over IPv6${hasIpv6Loopback ? '' : ' (skipped: no IPv6 loopback here)'}`, () => {
    const server = serve('::1');
    const store = client(server, 0);
    store.set('v6', 'yes');
    expect(store.getString('v6')).toBe('yes');
    // IPv6 only: not on the IPv4 loopback.
    expect(
      failure(() => new TcpStore({ host: '127.0.0.1', port: server.port, token: TOKEN, rank: 1, timeoutSeconds: 0.3 }))
        .message,
    ).toMatch(/no store answered/);
    server.close();
    expect(failure(() => store.get('v6')).message).toMatch(
      new RegExp(`the store at \\[::1\\]:${server.port} \\(served by rank 0\\) closed the connection`),
    );
  });
});
