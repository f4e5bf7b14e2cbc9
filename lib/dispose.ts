/**
 * The symbols of explicit resource management (`using` and `await using`): `Symbol.dispose` on
 * objects freed synchronously (modules, tensors), `Symbol.asyncDispose` on those closed
 * asynchronously (data loaders). Node 20.4+ defines both; on older versions of Node 20 they are
 * created here, once, as the standard polyfill does, so that every class of the package and any
 * other library that follows the convention agree on the same symbols.
 * @packageDocumentation
 */

const symbols = Symbol as { dispose?: symbol; asyncDispose?: symbol };
symbols.dispose ??= Symbol('Symbol.dispose');
symbols.asyncDispose ??= Symbol('Symbol.asyncDispose');

/** `Symbol.dispose`, defined on every version of Node the package supports. */
export const disposeSymbol: typeof Symbol.dispose = Symbol.dispose;

/** `Symbol.asyncDispose`, defined on every version of Node the package supports. */
export const asyncDisposeSymbol: typeof Symbol.asyncDispose = Symbol.asyncDispose;
