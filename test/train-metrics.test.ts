/**
 * Metrics against hand counts on small examples, and the classification report against the exact
 * text scikit-learn prints (the first example is the one in `classification_report`'s docstring;
 * the others were formatted with scikit-learn's own format strings).
 */
import { describe, expect, it } from 'vitest';
import { ConfusionMatrix, RunningAverage, accuracy, argmax, formatFixed, topkCorrect } from '../lib/train/metrics.js';

// Six samples, four classes. Rank of the label (classes above it, plus tied classes of lower index):
// s0 label 1: 0 (clear winner)          s3 label 3: 3 (all tied, three lower indices)
// s1 label 2: 1 (class 0 is higher)     s4 label 2: 1 (tied with class 1, which comes first)
// s2 label 0: 0 (all tied, lowest)      s5 label 3: 1 (NaN ranks highest, as in torch.topk)
const logits = new Float32Array([
  0.1,
  2.0,
  0.3,
  -1.0,
  3.0,
  1.0,
  2.0,
  0.0,
  0.0,
  0.0,
  0.0,
  0.0,
  0.0,
  0.0,
  0.0,
  0.0,
  1.0,
  5.0,
  5.0,
  2.0,
  NaN,
  1.0,
  2.0,
  3.0,
]);
const labels = new Int32Array([1, 2, 0, 3, 2, 3]);

function code(f: () => unknown): string | undefined {
  try {
    f();
  } catch (e) {
    return (e as { code?: string }).code;
  }
  return undefined;
}

describe('top-k accuracy', () => {
  it('counts hits by rank with ties toward the lower index, k clamped to the class count', () => {
    expect(topkCorrect(logits, labels, [1, 2, 3, 4, 5])).toEqual([2, 5, 5, 6, 6]);
    const [top1, top5] = accuracy(logits, labels);
    expect(top1).toBeCloseTo(2 / 6, 12);
    expect(top5).toBe(1); // top-5 of 4 classes is top-4
    expect(accuracy(new Float32Array(0), [], [1])).toEqual([0]);
    expect(Array.from(argmax(logits, 4))).toEqual([1, 0, 0, 0, 1, 0]);
  });

  it('rejects mismatched shapes and labels out of range', () => {
    expect(code(() => topkCorrect(new Float32Array(7), [0, 1]))).toBe('ERR_RC_INVALID_ARGUMENT');
    expect(() => topkCorrect(new Float32Array(6), [0, 3])).toThrow(/labels\[1\]/);
    expect(() => topkCorrect(new Float32Array(6), [0, 1], [0])).toThrow(/ks\[0\]/);
  });
});

describe('RunningAverage', () => {
  it('tracks the last value, window statistics and the weighted global average', () => {
    const m = new RunningAverage({ window: 3 });
    expect(Number.isNaN(m.avg)).toBe(true);
    m.update(4, 2);
    m.update(1);
    m.update(10, 1);
    m.update(2, 4); // the window now holds 1, 10, 2
    expect(m.value).toBe(2);
    expect(m.avg).toBeCloseTo(13 / 3, 12);
    expect(m.median).toBe(2);
    expect(m.max).toBe(10);
    expect(m.count).toBe(8);
    expect(m.globalAvg).toBeCloseTo((8 + 1 + 10 + 8) / 8, 12);
    m.update(3);
    expect(m.median).toBe(3); // window 10, 2, 3
    const even = new RunningAverage({ window: 4 });
    [4, 1, 3, 2].forEach((v) => even.update(v));
    expect(even.median).toBe(2); // the lower middle, as torch.median
    m.reset();
    expect(m.count).toBe(0);
  });
});

describe('ConfusionMatrix', () => {
  it('builds rows of true classes and columns of predictions, from logits or predictions', () => {
    const cm = new ConfusionMatrix(4);
    cm.update(logits, labels); // argmax: [1, 0, 0, 0, 1, 0]
    expect(cm.toArray()).toEqual([
      [1, 0, 0, 0],
      [0, 1, 0, 0],
      [1, 1, 0, 0],
      [2, 0, 0, 0],
    ]);
    cm.update([3, 3], [3, 2]);
    expect(cm.at(3, 3)).toBe(1);
    expect(cm.at(2, 3)).toBe(1);
    expect(cm.total).toBe(8);
    const other = ConfusionMatrix.fromArray(cm.toArray());
    cm.merge(other);
    expect(cm.at(3, 0)).toBe(4);
    expect(code(() => cm.update([4], [0]))).toBe('ERR_RC_INVALID_ARGUMENT');
    expect(code(() => cm.update(new Float32Array(3), [0]))).toBe('ERR_RC_INVALID_ARGUMENT');
  });

  // scikit-learn's docstring example: y_true = [0, 1, 2, 2, 2], y_pred = [0, 0, 2, 2, 1].
  const doc = new ConfusionMatrix(3);
  doc.update([0, 0, 2, 2, 1], [0, 1, 2, 2, 2]);

  it('per-class precision, recall, F1 and support, macro and weighted averages (hand counts)', () => {
    expect(doc.toArray()).toEqual([
      [1, 0, 0],
      [1, 0, 0],
      [0, 1, 2],
    ]);
    expect(doc.precision()).toEqual([0.5, 0, 1]); // class 1 is predicted once, wrongly
    expect(doc.recall()).toEqual([1, 0, 2 / 3]);
    expect(doc.f1()).toEqual([2 / 3, 0, 0.8]); // 2 tp / (support + predicted)
    expect(doc.support()).toEqual([1, 1, 3]);
    expect(doc.accuracy()).toBe(0.6);
    const macro = doc.macroAvg();
    expect(macro.precision).toBeCloseTo(0.5, 12);
    expect(macro.recall).toBeCloseTo(5 / 9, 12);
    expect(macro.f1).toBeCloseTo((2 / 3 + 0.8) / 3, 12);
    expect(macro.support).toBe(5);
    const weighted = doc.weightedAvg();
    expect(weighted.precision).toBeCloseTo(0.7, 12);
    expect(weighted.recall).toBeCloseTo(0.6, 12);
    expect(weighted.f1).toBeCloseTo((2 / 3 + 2.4) / 5, 12);
  });

  it("classificationReport prints scikit-learn's docstring example exactly", () => {
    expect(doc.classificationReport(['class 0', 'class 1', 'class 2'])).toBe(
      [
        '              precision    recall  f1-score   support',
        '',
        '     class 0       0.50      1.00      0.67         1',
        '     class 1       0.00      0.00      0.00         1',
        '     class 2       1.00      0.67      0.80         3',
        '',
        '    accuracy                           0.60         5',
        '   macro avg       0.50      0.56      0.49         5',
        'weighted avg       0.70      0.60      0.61         5',
        '',
      ].join('\n'),
    );
  });

  it('classificationReport: long names widen the first column, ties round to even, digits', () => {
    // Class 0 is predicted 8 times with 1 hit: precision 0.125, which Python formats as "0.12".
    const cm = ConfusionMatrix.fromArray([
      [1, 0, 1],
      [7, 2, 0],
      [0, 1, 3],
    ]);
    const names = ['aeroplane-long-name', 'b', 'c'];
    expect(cm.classificationReport(names)).toBe(
      [
        '                     precision    recall  f1-score   support',
        '',
        'aeroplane-long-name       0.12      0.50      0.20         2',
        '                  b       0.67      0.22      0.33         9',
        '                  c       0.75      0.75      0.75         4',
        '',
        '           accuracy                           0.40        15',
        '          macro avg       0.51      0.49      0.43        15',
        '       weighted avg       0.62      0.40      0.43        15',
        '',
      ].join('\n'),
    );
    expect(cm.classificationReport(names, 4)).toBe(
      [
        '                     precision    recall  f1-score   support',
        '',
        'aeroplane-long-name     0.1250    0.5000    0.2000         2',
        '                  b     0.6667    0.2222    0.3333         9',
        '                  c     0.7500    0.7500    0.7500         4',
        '',
        '           accuracy                         0.4000        15',
        '          macro avg     0.5139    0.4907    0.4278        15',
        '       weighted avg     0.6167    0.4000    0.4267        15',
        '',
      ].join('\n'),
    );
  });

  it('classificationReport: a class never seen nor predicted scores 0 (zero_division=0), default names', () => {
    const cm = ConfusionMatrix.fromArray([
      [2, 0],
      [0, 0],
    ]);
    expect(cm.classificationReport(['x', 'y'], 3)).toBe(
      [
        '              precision    recall  f1-score   support',
        '',
        '           x      1.000     1.000     1.000         2',
        '           y      0.000     0.000     0.000         0',
        '',
        '    accuracy                          1.000         2',
        '   macro avg      0.500     0.500     0.500         2',
        'weighted avg      1.000     1.000     1.000         2',
        '',
      ].join('\n'),
    );
    expect(cm.classificationReport().split('\n')[2]).toBe('           0       1.00      1.00      1.00         2');
    expect(code(() => cm.classificationReport(['only one']))).toBe('ERR_RC_INVALID_ARGUMENT');
  });
});

describe('formatFixed', () => {
  it("rounds like Python's format: exact binary value, ties to even", () => {
    expect(formatFixed(0.125, 2)).toBe('0.12'); // (0.125).toFixed(2) is "0.13"
    expect(formatFixed(0.375, 2)).toBe('0.38');
    expect(formatFixed(2.5, 0)).toBe('2');
    expect(formatFixed(1.005, 2)).toBe('1.00'); // 1.005 is stored as 1.00499999...
    expect(formatFixed(1e21, 1)).toBe('1000000000000000000000.0');
    expect(formatFixed(-0, 2)).toBe('-0.00');
    expect(formatFixed(5e-324, 3)).toBe('0.000');
    expect(formatFixed(123.456, 10)).toBe('123.4560000000');
    expect(formatFixed(NaN, 2)).toBe('nan');
  });
});
