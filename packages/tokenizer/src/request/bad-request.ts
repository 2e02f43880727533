/** A request body the EPP refuses (a 400): not JSON, a field of the wrong shape, what vLLM would refuse. */
export class BadRequest extends Error {}
