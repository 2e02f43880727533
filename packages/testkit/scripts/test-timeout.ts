// bun test preload (root bunfig.toml): every test file gets the project's default timeout, however the
// tests are started (`bun run test`, `bun test packages/x`, `bun test some.test.ts`).
//
// Why a loader and not configuration: Bun 1.4 does not read `timeout` from bunfig.toml's [test] table
// (a test there still times out after the built-in 5 s), and `setDefaultTimeout` called here would
// apply to the first test file only. So each test file's source starts with that call, on its first
// line (line numbers in failures stay right). A `--timeout` given on the command line wins.
import { plugin } from "bun";
import { readFileSync } from "node:fs";

const DEFAULT_TEST_TIMEOUT_MS = 60_000;

function timeoutOnCommandLine(): boolean {
  try {
    // Bun rewrites process.argv for test files; the kernel's copy has the flags as typed.
    return readFileSync("/proc/self/cmdline", "utf8")
      .split("\0")
      .some((a) => a === "--timeout" || a.startsWith("--timeout="));
  } catch {
    return false;
  }
}

if (!timeoutOnCommandLine()) {
  const prologue = `import { setDefaultTimeout as __kvEppSetDefaultTimeout } from "bun:test"; __kvEppSetDefaultTimeout(${DEFAULT_TEST_TIMEOUT_MS});`;
  plugin({
    name: "kv-epp-test-timeout",
    setup(build) {
      build.onLoad({ filter: /\.test\.ts$/ }, async ({ path }) => ({ contents: prologue + (await Bun.file(path).text()), loader: "ts" }));
    },
  });
}
