import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // Generous: a slow or busy machine must not fail a correct test; speed is measured by `npm run bench`.
    testTimeout: 900_000,
    hookTimeout: 120_000,
    pool: 'forks',
    reporters: ['default', './test/summary-reporter.ts'],
  },
});
