/**
 * Float64 reference implementations of the native ops, in the native layouts, for the op tests.
 * @packageDocumentation
 */
export * from './rng.js';
export * from './numeric.js';
export * from './conv.js';
export * from './pool.js';
export * from './batchnorm.js';
export * from './elementwise.js';
export * from './loss.js';
export * from './sgd.js';
export * from './gradcheck.js';
export * from './optim.js';
export * from './fake-quant.js';
export * from './sync-batchnorm.js';
