import { expect, test } from "bun:test";
import { parseConfig } from "./config.ts";

test("a bootstrap port is a port a prefill worker listens on: 1-65535, never 0", () => {
  for (const flag of ["--sglang-bootstrap-port", "--mooncake-bootstrap-port"]) {
    expect(() => parseConfig([flag, "0"])).toThrow(`invalid value for ${flag}: "0"`);
    expect(() => parseConfig([flag, "65536"])).toThrow(`invalid value for ${flag}: "65536"`);
  }
  expect(() => parseConfig([], { PD_SIDECAR_SGLANG_BOOTSTRAP_PORT: "0" })).toThrow("PD_SIDECAR_SGLANG_BOOTSTRAP_PORT");
  expect(parseConfig(["--sglang-bootstrap-port", "1", "--mooncake-bootstrap-port", "65535"])).toMatchObject({ sglangBootstrapPort: 1, mooncakeBootstrapPort: 65535 });
  // The sidecar's own listening port may still be 0 (ephemeral).
  expect(parseConfig(["--port", "0"]).port).toBe(0);
});
