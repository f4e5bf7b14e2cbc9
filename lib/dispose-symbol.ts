/**
 * `Symbol.dispose`, which `using` declarations call, exists from Node 20.4 (and 18.18); the package
 * supports Node 20.0 up, so on the few releases without it the symbol is created here, once, under
 * the same description as the built-in, before any class defines a `[Symbol.dispose]` method.
 * Imported for its effect only.
 * @packageDocumentation
 */
const symbols = Symbol as unknown as { dispose?: symbol };
symbols.dispose ??= Symbol('Symbol.dispose');
