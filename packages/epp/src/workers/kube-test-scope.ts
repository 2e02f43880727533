// The fake API server (@kv-epp/testkit, real HTTP list and watch) for the tests of the workers'
// Kubernetes sources: one per test, closed after it with whatever else the test registered.
import { afterEach } from "bun:test";
import { startFakeKubeApi, type FakeKubeApi, type FakeKubeApiOptions } from "@kv-epp/testkit";
import pino from "pino";

export const NS = "llm";
export const quiet = pino({ level: "silent" });

/** Called at a test file's top level; what `api()` starts and `onCleanup` registers ends after each test. */
export function kubeTestScope() {
  const cleanups: (() => unknown)[] = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });
  return {
    onCleanup: (c: () => unknown) => void cleanups.push(c),
    async api(o: FakeKubeApiOptions = {}): Promise<FakeKubeApi> {
      const api = await startFakeKubeApi(o);
      cleanups.push(() => api.close());
      return api;
    },
  };
}
