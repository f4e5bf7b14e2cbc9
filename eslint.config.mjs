// ESLint: typescript-eslint's strict and stylistic rule sets with type information (tsconfig.json)
// for the TypeScript; the same rules less those that need types for the plain JavaScript scripts.
// Layout is Prettier's job. `npm run lint` runs it over the tracked files (scripts/lint.mjs).
import eslint from '@eslint/js';
import { defineConfig, globalIgnores } from 'eslint/config';
import globals from 'globals';
import tseslint from 'typescript-eslint';

/**
 * `@typescript-eslint/no-non-null-assertion`, less element access. tsconfig.json sets
 * noUncheckedIndexedAccess, so every `a[i]` is `T | undefined`; where the index is in range by
 * construction (a loop over a buffer's elements, a fixed-length tuple) the code says so with
 * `a[i]!`, the idiom that setting asks for. Any other `x!` (a Map lookup, an optional field, a
 * `find`) asserts something the types could be made to know, and is reported.
 */
const nonNullOnlyOnElementAccess = {
  meta: {
    type: 'problem',
    docs: { description: 'Disallow non-null assertions, except on element access (a[i]!)' },
    messages: {
      nonNull:
        'Non-null assertion on something other than an element access: narrow the value (a check that throws, `?.`, `??`) or give it a type without undefined.',
    },
    schema: [],
  },
  create(context) {
    return {
      TSNonNullExpression(node) {
        if (node.expression.type === 'MemberExpression' && node.expression.computed) return;
        context.report({ node, messageId: 'nonNull' });
      },
    };
  },
};

export default defineConfig(
  globalIgnores(['build/', 'dist/', 'prebuilds/', 'bench/results/', 'runs/']),
  eslint.configs.recommended,
  tseslint.configs.strictTypeChecked,
  tseslint.configs.stylisticTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    plugins: { 'resnet-cuda': { rules: { 'non-null-only-on-element-access': nonNullOnlyOnElementAccess } } },
    rules: {
      '@typescript-eslint/no-non-null-assertion': 'off',
      'resnet-cuda/non-null-only-on-element-access': 'error',
      // Numbers in messages and labels are the common case (`${n} images`); objects, nullish values
      // and booleans still need an explicit conversion.
      '@typescript-eslint/restrict-template-expressions': ['error', { allowNumber: true }],
      // `expect(() => f()).toThrow()` and `(v) => resolve(v)` are the test runner's and the code's idiom.
      '@typescript-eslint/no-confusing-void-expression': ['error', { ignoreArrowShorthand: true }],
      // Public arguments are checked at run time whatever their declared types say (JavaScript
      // callers, JSON state): those checks are the rule's "unnecessary" conditions.
      '@typescript-eslint/no-unnecessary-condition': 'off',
      // One-line `if (a) return b;` is the code's habit; a body on its own line gets braces (as
      // Prettier wraps a long one-liner, `--fix` adds them).
      curly: ['error', 'multi-line'],
      // Its fix turns a getter that returns a literal into a readonly field, which would hide the
      // getter of a subclass (Transform's flags are meant to be overridden, by users' transforms too).
      '@typescript-eslint/class-literal-property-style': 'off',
      // A leading underscore marks a parameter or binding that is unused on purpose (a signature to
      // implement, a property taken out of a rest object).
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', destructuredArrayIgnorePattern: '^_' },
      ],
    },
  },
  {
    // The install and packaging scripts run as plain Node.js ES modules, outside tsconfig.json.
    files: ['**/*.{js,mjs,cjs}'],
    extends: [tseslint.configs.disableTypeChecked],
    languageOptions: { globals: globals.node },
  },
);
