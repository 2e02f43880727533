// Adding and freeing tree nodes: a node enters the CHILD table under its parent and leaves it, and its
// parent counts its children.
import { DEAD, ID_MASK, NIL } from "./ids";
import { CHILD_MAX, growNodes, maskExtAt, maskWords, nodeAt, nodeCap, nodeFree, nodeTop, nodesLive } from "./nodes";
import { childInsertAfterMiss } from "./table-growth";
import { CHILD, tableDeleteAt } from "./tables";

/** A new child of `parent` without records; childFind(parent, seq) has just missed (its probe found the slot). */
export function newNode(parent: u32, seq: u64): u32 {
  let id: u32;
  if (nodeFree != NIL) {
    id = nodeFree;
    nodeFree = load<u32>(nodeAt(id), 8);
  } else {
    if (nodeTop == nodeCap) growNodes();
    id = nodeTop++;
  }
  const p = nodeAt(id), pp = nodeAt(parent);
  store<u64>(p, seq);
  store<u64>(p, 0, 8);
  store<u32>(p, parent, 16);
  store<u32>(p, 0, 20);
  if (maskWords > 1) memory.fill(maskExtAt(id, 1), 0, <usize>(maskWords - 1) << 3);
  const c = load<u32>(pp, 20);
  if ((c & CHILD_MAX) != CHILD_MAX) store<u32>(pp, c + 1, 20);
  childInsertAfterMiss(id, seq);
  nodesLive++;
  return id;
}

/** Frees a node with neither records nor children; returns its parent (which lost a child). */
export function freeNode(id: u32): u32 {
  const p = nodeAt(id);
  const parent = load<u32>(p, 16) & ID_MASK;
  tableDeleteAt(CHILD, id, load<u64>(p));
  store<u32>(p, DEAD, 16); // marks the slot free for table rebuilds
  store<u64>(p, <u64>nodeFree, 8);
  nodeFree = id;
  nodesLive--;
  const pp = nodeAt(parent);
  const c = load<u32>(pp, 20);
  if ((c & CHILD_MAX) != CHILD_MAX) store<u32>(pp, c - 1, 20);
  return parent;
}
