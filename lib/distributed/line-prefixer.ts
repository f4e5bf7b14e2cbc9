/**
 * Prefixes every line of a stream (a rank's output) before passing it on, one whole line at a
 * time, so that the lines of several processes sharing one terminal interleave but never mix.
 * @packageDocumentation
 */
import { StringDecoder } from 'node:string_decoder';

/**
 * Splits text into lines and writes each complete line, with `prefix` in front, to `write`. A
 * partial line is kept until its newline arrives (or {@link LinePrefixer.end} flushes it).
 * Multi-byte UTF-8 characters split between chunks are reassembled.
 */
export class LinePrefixer {
  private readonly decoder = new StringDecoder('utf8');
  private pending = '';

  /**
   * @param prefix Put before every line (`[rank 3] `).
   * @param write Receives whole prefixed lines, each ending in `\n`, several per call at most.
   */
  constructor(
    private readonly prefix: string,
    private readonly write: (text: string) => void,
  ) {}

  /** Takes the next chunk of the stream. */
  push(chunk: Buffer | string): void {
    const text = this.pending + (typeof chunk === 'string' ? chunk : this.decoder.write(chunk));
    const last = text.lastIndexOf('\n');
    if (last === -1) {
      this.pending = text;
      return;
    }
    this.pending = text.slice(last + 1);
    this.write(this.prefixed(text.slice(0, last)));
  }

  /** The stream ended: writes what remains of a last line without a newline, adding one. */
  end(): void {
    const rest = this.pending + this.decoder.end();
    this.pending = '';
    if (rest !== '') this.write(this.prefixed(rest));
  }

  /** `lines` (without the final newline) with the prefix before each and a newline after each. */
  private prefixed(lines: string): string {
    return lines
      .split('\n')
      .map((line) => `${this.prefix}${line}\n`)
      .join('');
  }
}
