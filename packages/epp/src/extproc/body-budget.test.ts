import { expect, test } from "bun:test";
import { BodyBudget } from "./body-budget.ts";

test("bytes are taken while they fit, and a body alone is always taken, whatever the bound", () => {
  const b = new BodyBudget(100);
  expect(b.take(60)).toBe(true);
  expect(b.take(50)).toBe(false); // another body's 60 held: over the bound
  expect(b.usedBytes).toBe(60);
  // The holder of those 60 goes on past the bound: they are all the process holds.
  expect(b.take(50, 60)).toBe(true);
  expect(b.usedBytes).toBe(110);
  b.give(110);
  expect(b.take(500, 0)).toBe(true); // one body larger than the bound, alone
  expect(b.take(1, 0)).toBe(false);
});

test("bytes held whatever the bound count like taken ones; every give is told to the listeners", () => {
  const b = new BodyBudget(100);
  let told = 0;
  const off = b.onGive(() => told++);
  b.hold(150); // arrived: counted past the bound
  expect(b.usedBytes).toBe(150);
  expect(b.take(1)).toBe(false);
  b.give(0); // nothing given: nobody told
  b.give(150);
  expect(told).toBe(1);
  off();
  b.hold(10);
  b.give(10);
  expect(told).toBe(1);
});
