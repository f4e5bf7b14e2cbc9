/**
 * The quadtree of Barnes-Hut t-SNE (van der Maaten, "Accelerating t-SNE using Tree-Based
 * Algorithms", JMLR 15:3221-3245, 2014, section 4.2): square cells over the 2-D embedding, each
 * holding the number of points under it and their centre of mass, so that the repulsion of a
 * distant cell's points is computed once from its centre of mass.
 *
 * Built again at every iteration into the same typed arrays (they grow only when a tree needs more
 * nodes than any before), and walked with a preallocated stack: no allocation per iteration.
 * @packageDocumentation
 */

/**
 * Cells are split down to this depth at most; deeper, a leaf keeps several points. A cell at depth
 * 48 is 2^-48 of the embedding's extent across, where distinct double coordinates are rare.
 */
const MAX_DEPTH = 48;

/** A point quadtree over 2-D coordinates with each cell's count and centre of mass. */
export class QuadTree {
  #capacity = 0;
  /** Nodes in use; node 0 is the root. */
  #size = 0;
  /** Cell centres and half side lengths. */
  #cx = new Float64Array(0);
  #cy = new Float64Array(0);
  #half = new Float64Array(0);
  /** Sums of the coordinates under each cell while building, then their mean (the centre of mass). */
  #mx = new Float64Array(0);
  #my = new Float64Array(0);
  #count = new Int32Array(0);
  /** Index of a cell's first child (the four are consecutive: lower-left, lower-right, upper-left, upper-right), or -1 for a leaf. */
  #child = new Int32Array(0);
  /** A leaf's first point, or -1 when it is empty; the others follow through `#next`. */
  #first = new Int32Array(0);
  #depth = new Int32Array(0);
  /** The next point in the same leaf, per point. */
  #next = new Int32Array(0);
  /** The traversal's stack: a walk pops one cell and pushes at most four, once per level. */
  readonly #stack = new Int32Array(4 * (MAX_DEPTH + 2));
  /** The repulsive force of the last {@link repulsion} call (x and y components). */
  forceX = 0;
  /** See {@link forceX}. */
  forceY = 0;

  /** The nodes of the last build, for tests and diagnostics. */
  get size(): number {
    return this.#size;
  }

  /**
   * Builds the tree of the first `n` points of `y` (`[x0, y0, x1, y1, ...]`), replacing the
   * previous one.
   */
  build(y: Float64Array, n: number): void {
    if (this.#next.length < n) this.#next = new Int32Array(n);
    if (this.#capacity === 0) this.#grow(Math.max(16, 2 * n));
    let minX = Infinity;
    let minY = Infinity;
    let maxX = -Infinity;
    let maxY = -Infinity;
    for (let i = 0; i < n; i++) {
      const x = y[2 * i]!;
      const v = y[2 * i + 1]!;
      if (x < minX) minX = x;
      if (x > maxX) maxX = x;
      if (v < minY) minY = v;
      if (v > maxY) maxY = v;
    }
    // Slightly larger than the points' extent, so that the largest coordinates fall inside.
    const half = (Math.max(maxX - minX, maxY - minY) / 2) * (1 + 1e-6) + 1e-12;
    this.#size = 0;
    this.#initNode(this.#size++, (minX + maxX) / 2, (minY + maxY) / 2, half, 0);
    for (let i = 0; i < n; i++) this.#insert(y, i);
    for (let c = 0; c < this.#size; c++) {
      const k = this.#count[c]!;
      if (k > 0) {
        this.#mx[c]! /= k;
        this.#my[c]! /= k;
      }
    }
  }

  /**
   * The repulsion on point `i` at `(px, py)` from the other points, with the Barnes-Hut
   * approximation: a cell whose diagonal `r` satisfies `r / |y_i - centre of mass| < theta` acts as
   * one point of its count's weight (theta 0 visits every point: the exact sum). Returns this
   * point's share of the normalisation `Z = sum_{j != i} (1 + |y_i - y_j|^2)^-1` and leaves the
   * unnormalised force `sum_j (1 + |y_i - y_j|^2)^-2 (y_i - y_j)` in {@link forceX}/{@link forceY}.
   */
  repulsion(y: Float64Array, i: number, theta: number): number {
    const px = y[2 * i]!;
    const py = y[2 * i + 1]!;
    const theta2 = theta * theta;
    const stack = this.#stack;
    let sp = 0;
    stack[sp++] = 0;
    let sumQ = 0;
    let fx = 0;
    let fy = 0;
    while (sp > 0) {
      const node = stack[--sp]!;
      const count = this.#count[node]!;
      if (count === 0) continue;
      const child = this.#child[node]!;
      if (child < 0) {
        for (let j = this.#first[node]!; j >= 0; j = this.#next[j]!) {
          if (j === i) continue;
          const dx = px - y[2 * j]!;
          const dy = py - y[2 * j + 1]!;
          const q = 1 / (1 + dx * dx + dy * dy);
          sumQ += q;
          const q2 = q * q;
          fx += q2 * dx;
          fy += q2 * dy;
        }
        continue;
      }
      const dx = px - this.#mx[node]!;
      const dy = py - this.#my[node]!;
      const d2 = dx * dx + dy * dy;
      const h = this.#half[node]!;
      // The diagonal of a square of side 2h is 2h * sqrt(2): r^2 = 8 h^2.
      if (8 * h * h < theta2 * d2) {
        const q = 1 / (1 + d2);
        sumQ += count * q;
        const m = count * q * q;
        fx += m * dx;
        fy += m * dy;
      } else {
        stack[sp++] = child;
        stack[sp++] = child + 1;
        stack[sp++] = child + 2;
        stack[sp++] = child + 3;
      }
    }
    this.forceX = fx;
    this.forceY = fy;
    return sumQ;
  }

  #insert(y: Float64Array, p: number): void {
    const x = y[2 * p]!;
    const v = y[2 * p + 1]!;
    let node = 0;
    for (;;) {
      this.#count[node]!++;
      this.#mx[node]! += x;
      this.#my[node]! += v;
      const child = this.#child[node]!;
      if (child >= 0) {
        node = child + this.#quadrant(node, x, v);
        continue;
      }
      const first = this.#first[node]!;
      if (first < 0) {
        this.#first[node] = p;
        this.#next[p] = -1;
        return;
      }
      const fx = y[2 * first]!;
      const fy = y[2 * first + 1]!;
      // A leaf holds one position (one point, or several at the same coordinates): a point at the
      // same place, or a leaf at the maximum depth, joins its list instead of splitting it.
      if ((fx === x && fy === v) || this.#depth[node]! >= MAX_DEPTH) {
        this.#next[p] = first;
        this.#first[node] = p;
        return;
      }
      const c = this.#split(node);
      const target = c + this.#quadrant(node, fx, fy);
      this.#first[target] = first;
      this.#count[target] = this.#count[node]! - 1;
      this.#mx[target] = this.#mx[node]! - x;
      this.#my[target] = this.#my[node]! - v;
      this.#first[node] = -1;
      node = c + this.#quadrant(node, x, v);
    }
  }

  #quadrant(node: number, x: number, v: number): number {
    return (x >= this.#cx[node]! ? 1 : 0) + (v >= this.#cy[node]! ? 2 : 0);
  }

  /** Gives `node` four empty children and returns the first's index. */
  #split(node: number): number {
    if (this.#size + 4 > this.#capacity) this.#grow(2 * this.#capacity);
    const c = this.#size;
    this.#size += 4;
    const h = this.#half[node]! / 2;
    const cx = this.#cx[node]!;
    const cy = this.#cy[node]!;
    const depth = this.#depth[node]! + 1;
    this.#initNode(c, cx - h, cy - h, h, depth);
    this.#initNode(c + 1, cx + h, cy - h, h, depth);
    this.#initNode(c + 2, cx - h, cy + h, h, depth);
    this.#initNode(c + 3, cx + h, cy + h, h, depth);
    this.#child[node] = c;
    return c;
  }

  #initNode(node: number, cx: number, cy: number, half: number, depth: number): void {
    this.#cx[node] = cx;
    this.#cy[node] = cy;
    this.#half[node] = half;
    this.#mx[node] = 0;
    this.#my[node] = 0;
    this.#count[node] = 0;
    this.#child[node] = -1;
    this.#first[node] = -1;
    this.#depth[node] = depth;
  }

  #grow(capacity: number): void {
    const f64 = (old: Float64Array<ArrayBuffer>): Float64Array<ArrayBuffer> => {
      const a = new Float64Array(capacity);
      a.set(old);
      return a;
    };
    const i32 = (old: Int32Array<ArrayBuffer>): Int32Array<ArrayBuffer> => {
      const a = new Int32Array(capacity);
      a.set(old);
      return a;
    };
    this.#cx = f64(this.#cx);
    this.#cy = f64(this.#cy);
    this.#half = f64(this.#half);
    this.#mx = f64(this.#mx);
    this.#my = f64(this.#my);
    this.#count = i32(this.#count);
    this.#child = i32(this.#child);
    this.#first = i32(this.#first);
    this.#depth = i32(this.#depth);
    this.#capacity = capacity;
  }
}
