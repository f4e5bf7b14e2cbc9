/**
 * A stand-in for a photo that JPEG encodes like one: smooth gradients, a disc, a block and noise
 * (from `seed`), as packed RGB bytes.
 */
export function photo(height: number, width: number, seed = 7): Buffer {
  const data = Buffer.alloc(height * width * 3);
  let s = seed;
  const noise = () => (s = (Math.imul(s, 1103515245) + 12345) >>> 0) >>> 26;
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const o = (y * width + x) * 3;
      const inDisc = (x - width * 0.3) ** 2 + (y - height * 0.4) ** 2 < (height * 0.2) ** 2;
      data[o] = inDisc ? 220 : Math.round((255 * x) / width);
      data[o + 1] = x > width * 0.6 && y < height * 0.7 ? 30 : Math.round((255 * y) / height);
      data[o + 2] = (inDisc ? 40 : 100) + noise();
    }
  }
  return data;
}
