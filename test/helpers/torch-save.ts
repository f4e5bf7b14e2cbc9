/**
 * A minimal `torch.save` for tests: a state dict written as PyTorch's zip format does (a
 * protocol-2 `data.pkl` of an OrderedDict of `_rebuild_tensor_v2` calls whose storages are
 * persistent ids, and one `data/<key>` entry per tensor), so that the command line can be run on
 * `.pth` files of any model without Python. The reader itself is checked against files written
 * by PyTorch (test/fixtures/make-torch-fixtures.py).
 */
import type { StateDict } from '../../lib/nn/module.js';
import { makeZip, type ZipInput } from './zip-writer.js';

const op = (...codes: number[]) => Buffer.from(codes);
const text = (s: string) => {
  const bytes = Buffer.from(s, 'utf8');
  const head = Buffer.alloc(5);
  head[0] = 0x58; // BINUNICODE
  head.writeUInt32LE(bytes.length, 1);
  return Buffer.concat([head, bytes]);
};
const int = (n: number) => {
  const b = Buffer.alloc(5);
  b[0] = 0x4a; // BININT
  b.writeInt32LE(n, 1);
  return b;
};
const global = (module: string, name: string) => Buffer.from(`c${module}\n${name}\n`, 'latin1');
const tuple = (items: Buffer[]) => Buffer.concat([op(0x28), ...items, op(0x74)]);
const orderedDict = () => Buffer.concat([global('collections', 'OrderedDict'), op(0x29, 0x52)]);

/** The bytes of `torch.save(state_dict, f)` for `state` (f32 and i64 tensors, contiguous). */
export function torchSave(state: StateDict, archive = 'archive'): Buffer {
  const parts: Buffer[] = [op(0x80, 2), orderedDict(), op(0x28)];
  const entries: ZipInput[] = [];
  let key = 0;
  for (const [name, entry] of state) {
    const numel = entry.data.length;
    const strides = entry.shape.map((_, i) => entry.shape.slice(i + 1).reduce((a, b) => a * b, 1));
    const storageType = entry.dtype === 'f32' ? 'FloatStorage' : 'LongStorage';
    const pid = tuple([text('storage'), global('torch', storageType), text(String(key)), text('cpu'), int(numel)]);
    parts.push(
      text(name),
      global('torch._utils', '_rebuild_tensor_v2'),
      tuple([
        pid,
        op(0x51), // BINPERSID
        int(0),
        tuple(entry.shape.map(int)),
        tuple(strides.map(int)),
        op(0x89), // False
        orderedDict(),
      ]),
      op(0x52), // REDUCE
    );
    const data = entry.data;
    entries.push({
      name: `${archive}/data/${key}`,
      data: new Uint8Array(data.buffer, data.byteOffset, data.byteLength),
    });
    key++;
  }
  parts.push(op(0x75, 0x2e)); // SETITEMS, STOP
  return makeZip([
    { name: `${archive}/data.pkl`, data: Buffer.concat(parts) },
    { name: `${archive}/byteorder`, data: Buffer.from('little') },
    ...entries,
    { name: `${archive}/version`, data: Buffer.from('3\n') },
  ]);
}
