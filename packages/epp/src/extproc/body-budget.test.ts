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

test("bytes of messages still arriving count against the bound, but not against a body being alone", () => {
  const b = new BodyBudget(100);
  b.hold(150); // arrived: counted past the bound
  expect(b.usedBytes).toBe(150);
  expect(b.arrivingBytes).toBe(150);
  expect(b.take(10)).toBe(true); // the only body: taken though the bound is passed
  expect(b.take(10)).toBe(false); // another body's 10 held
  expect(b.take(10, 10)).toBe(true); // the holder of those 10 goes on
  expect(b.arrivingBytes).toBe(150); // bodies taken are not arriving bytes
  b.unhold(150);
  b.give(20);
  expect(b.usedBytes).toBe(0);
  expect(b.arrivingBytes).toBe(0);
});

test("reply warming keeps bytes within its share of the bound, counted as held", () => {
  const b = new BodyBudget(1000); // a share of 250
  expect(b.keep(200)).toBe(true);
  expect(b.keep(60)).toBe(false); // 260 past the share: nothing kept
  expect(b.usedBytes).toBe(200);
  b.unkeep(200);
  expect(b.usedBytes).toBe(0);
  expect(b.keep(250)).toBe(true);
});

test("what warming keeps is left out when a body is weighed against the bound", () => {
  const b = new BodyBudget(1000);
  expect(b.keep(250)).toBe(true);
  expect(b.take(600)).toBe(true);
  expect(b.take(400)).toBe(true); // 1000 bodies, within the bound: the 250 kept do not count
  expect(b.take(1)).toBe(false);
  expect(b.usedBytes).toBe(1250);
});
