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

test("answers not yet sent count as held and against a body, but not against a body being alone", () => {
  const b = new BodyBudget(100);
  b.holdOutput(90);
  expect(b.usedBytes).toBe(90);
  expect(b.outputBytes).toBe(90);
  expect(b.arrivingBytes).toBe(0);
  expect(b.take(20)).toBe(true); // the only body
  expect(b.take(5)).toBe(false); // 115 with another body's 20 held
  b.unholdOutput(90);
  expect(b.take(5)).toBe(true);
  b.give(25);
  expect(b.usedBytes).toBe(0);
  expect(b.outputBytes).toBe(0);
});

test("messages deferred while a route is pending have a bound of their own: bodies filling the budget refuse none, and one is always let through", () => {
  const b = new BodyBudget(100);
  expect(b.take(100)).toBe(true);
  expect(b.defer(30)).toBe(true); // bodies fill the bound: deferred messages are weighed apart
  expect(b.defer(80)).toBe(false); // 110 deferred
  expect(b.defer(70)).toBe(true);
  expect(b.usedBytes).toBe(200);
  expect(b.take(1)).toBe(false); // they count against bodies
  b.undefer(100);
  expect(b.defer(500)).toBe(true); // alone, larger than the bound
  b.undefer(500);
  b.give(100);
  expect(b.usedBytes).toBe(0);
});
