'use strict';
// `require('resnet-cuda')`: the package is an ES module. Node.js versions that can require an ES
// module (20.19+, 22.12+) get it here; the others get an error that says how to load it instead of
// Node's generic ERR_REQUIRE_ESM text.

const ESM_ONLY_CODES = new Set(['ERR_REQUIRE_ESM', 'ERR_REQUIRE_ASYNC_MODULE']);

/** The error for a Node.js that cannot require() an ES module. */
function esmOnlyError(cause) {
  const error = new Error(
    [
      'resnet-cuda is an ES module package, and require() cannot load ES modules in this Node.js ' +
        `process (${process.version}; Node.js 20.19+ and 22.12+ can, unless started with --no-experimental-require-module).`,
      'From CommonJS, load it with a dynamic import inside an async function:',
      "  const { ResNet50 } = await import('resnet-cuda');",
      'or write your code as an ES module (an .mjs file, or "type": "module" in package.json) with',
      "  import { ResNet50 } from 'resnet-cuda';",
    ].join('\n'),
    { cause },
  );
  error.code = 'ERR_REQUIRE_ESM';
  return error;
}

try {
  // This file is the package's CommonJS entry point: require() is what it is for.
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  module.exports = require('../dist/lib/index.js');
} catch (error) {
  if (error && ESM_ONLY_CODES.has(error.code)) throw esmOnlyError(error);
  throw error;
}
