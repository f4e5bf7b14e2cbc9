/**
 * CRC-32C (Castagnoli): the checksum of TensorBoard's TFRecord framing and of the tensor data in
 * checkpoints.
 * @packageDocumentation
 */

// CRC-32C (Castagnoli), reflected polynomial 0x82F63B78, one table lookup per byte.
const CRC32C_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

/**
 * The CRC-32C (Castagnoli) checksum of `data`, as TFRecord files and checkpoints use; `crc32c("123456789")` is
 * `0xE3069283`.
 * @param data - the bytes.
 * @param crc - a previous result, to continue a checksum over several chunks; default 0.
 */
export function crc32c(data: Uint8Array, crc = 0): number {
  let c = ~crc >>> 0;
  for (const byte of data) c = CRC32C_TABLE[(c ^ byte) & 0xff]! ^ (c >>> 8);
  return ~c >>> 0;
}
