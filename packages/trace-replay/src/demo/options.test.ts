import { expect, test } from "bun:test";
import { parseDemoArgs } from "./options.ts";

test("the demo spreads each recorded ~3 s step's records over the step unless told to keep them at one instant", () => {
  expect(parseDemoArgs([]).arrivals).toBe("spread");
  expect(parseDemoArgs(["--arrivals", "recorded"]).arrivals).toBe("recorded");
  expect(() => parseDemoArgs(["--arrivals", "poisson"])).toThrow(/arrivals/);
});
