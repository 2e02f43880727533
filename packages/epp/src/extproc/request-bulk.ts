// How much of an encoded ProcessingRequest its decoding would build objects from: all of it but its body's
// bytes (HttpBody.body of request_body or response_body, which decodes as one view of the message). Read
// from the wire format, tags and lengths only, as protobufjs (proto-loader's decoder) reads them: a 40 MiB
// request_headers of ~8 million empty HeaderValues takes seconds and hundreds of MB to decode, and
// milliseconds to walk. Only the body may be large (Envoy caps headers at tens of KiB).
//
// Field numbers (envoy/service/ext_proc/v3/external_processor.proto): ProcessingRequest request_headers = 2,
// response_headers = 3, request_body = 4, response_body = 5, request_trailers = 6, response_trailers = 7,
// metadata_context = 8, attributes = 9, protocol_config = 11 (length-delimited), observability_mode = 10
// (varint); HttpBody body = 1 (length-delimited), end_of_stream = 2 (varint).

// Wire types.
const [VARINT, I64, LEN, SGROUP, EGROUP, I32] = [0, 1, 2, 3, 4, 5] as const;

/**
 * The wire type of each known field. protobufjs reads a known field by its declared type whatever wire type
 * it is sent with, so a field sent with another would be read differently from this walk (one byte read as
 * a bool here, skipped as a length there): such a message is refused as unreadable.
 */
const REQUEST: Record<number, number> = { 2: LEN, 3: LEN, 4: LEN, 5: LEN, 6: LEN, 7: LEN, 8: LEN, 9: LEN, 10: VARINT, 11: LEN };
const BODY: Record<number, number> = { 1: LEN, 2: VARINT };
const BODY_FIELDS = new Set([4, 5]);
/** protobufjs's nesting limit for unknown groups (util.recursionLimit). */
const MAX_GROUP_DEPTH = 100;

/**
 * The bytes of an encoded ProcessingRequest outside its largest body (a second body, or one repeated inside
 * its HttpBody, counts as outside: only the last decodes into the message, the others are work too); a number
 * past `limit` as soon as the walk is certain of that, without finishing it. Undefined when protobufjs would
 * not read it as this walk does: a varint or a length past its message's end, a wire type that is not the
 * field's, or an invalid one.
 */
export function bytesBesideBody(msg: Uint8Array, limit: number): number | undefined {
  const w = new Walk(msg, limit);
  if (!w.message(msg.length, REQUEST, false)) return undefined;
  return w.over() ? w.other : msg.length - w.largest;
}

/**
 * Whether a ProcessingRequest of `length` bytes, of which `prefix` (its first bytes) has arrived, is certain to have
 * more than `limit` bytes beside its body: the fields ahead of its first body, as far as the prefix holds them (a
 * length-delimited one by its tag and declared length), already count more (a request_headers of millions of tiny
 * entries declares its size in its first bytes). bytesBesideBody of the whole message is then past `limit` too: it
 * reads those fields alike and stops as soon as its count is past. False while the prefix cannot tell (a body first,
 * a group), and wherever the whole walk might refuse the message as unreadable instead (a wire type that is not the
 * field's, a length past the message's end): those are left to it.
 */
export function besideBodyOverSoFar(prefix: Uint8Array, length: number, limit: number): boolean {
  return new Walk(prefix, limit).prefixOver(length);
}

class Walk {
  pos = 0;
  /** Bytes seen that are not a body's: tags, lengths, every other field. */
  other = 0;
  largest = 0;

  constructor(
    private readonly buf: Uint8Array,
    private readonly limit: number,
  ) {}

  over(): boolean {
    return this.other > this.limit;
  }

  /** The fields up to `end`, as protobufjs decodes a message whose known fields are `known`; false when it could not. */
  message(end: number, known: Record<number, number>, inBody: boolean): boolean {
    while (this.pos < end && !this.over()) {
      const start = this.pos;
      const tag = this.tag(end, known);
      if (tag < 0) return false;
      const field = tag >>> 3;
      const wire = tag & 7;
      if (wire === LEN) {
        const n = this.uint32(end);
        if (n < 0 || this.pos + n > end) return false;
        this.other += this.pos - start;
        if (inBody && field === 1) {
          this.largest = Math.max(this.largest, n);
          this.pos += n;
        } else if (!inBody && BODY_FIELDS.has(field)) {
          if (!this.message(this.pos + n, BODY, true)) return false;
        } else {
          this.other += n;
          this.pos += n;
        }
        continue;
      }
      if (!this.scalar(wire, known[field], end)) return false;
      this.other += this.pos - start;
    }
    return true;
  }

  /** Over a message's first bytes (the buffer, of a message of `length`): see besideBodyOverSoFar. */
  prefixOver(length: number): boolean {
    const end = this.buf.length;
    while (this.pos < end) {
      const start = this.pos;
      const tag = this.tag(end, REQUEST);
      if (tag < 0) return false;
      const field = tag >>> 3;
      const wire = tag & 7;
      if (wire === LEN) {
        const n = this.uint32(end);
        if (n < 0 || this.pos + n > length) return false;
        this.other += this.pos - start;
        // What a body holds besides its bytes is not counted here: a body first ends the look.
        if (BODY_FIELDS.has(field)) return this.over();
        this.other += n;
        if (this.over()) return true;
        this.pos += n;
        continue;
      }
      // Another field read as the whole walk reads it, as far as the prefix holds it (a group is left to that walk).
      if (wire === SGROUP || !this.scalar(wire, REQUEST[field], end)) return false;
      this.other += this.pos - start;
      if (this.over()) return true;
    }
    return false;
  }

  /** A field's tag, or -1 past `end` or when its wire type is not the one `known` declares for it. */
  private tag(end: number, known: Record<number, number>): number {
    const tag = this.uint32(end);
    const declared = tag < 0 ? undefined : known[tag >>> 3];
    return declared !== undefined && declared !== (tag & 7) ? -1 : tag;
  }

  /** A field's value that is not length-delimited: a known varint read as protobufjs reads a bool, anything else skipped. */
  private scalar(wire: number, declared: number | undefined, end: number): boolean {
    return declared === VARINT ? this.uint32(end) >= 0 : this.skip(wire, end, 0);
  }

  /** protobufjs's Reader.uint32: a 32-bit varint, or -1 past `end`. Past 5 bytes it skips 5 more (a negative int32's 10). */
  private uint32(end: number): number {
    let value = 0;
    for (let i = 0; i < 5; i++) {
      if (this.pos >= end) return -1;
      const b = this.buf[this.pos++]!;
      value = (value | ((b & (i === 4 ? 15 : 127)) << (7 * i))) >>> 0;
      if (b < 128) return value;
    }
    this.pos += 5;
    return this.pos > end ? -1 : value;
  }

  /** protobufjs's Reader.skipType for an unknown field's value. */
  private skip(wire: number, end: number, depth: number): boolean {
    switch (wire) {
      case VARINT:
        do if (this.pos >= end) return false;
        while (this.buf[this.pos++]! & 128);
        return true;
      case I64:
        this.pos += 8;
        return this.pos <= end;
      case I32:
        this.pos += 4;
        return this.pos <= end;
      case LEN: {
        const n = this.uint32(end);
        this.pos += n;
        return n >= 0 && this.pos <= end;
      }
      case SGROUP:
        if (depth >= MAX_GROUP_DEPTH) return false;
        for (;;) {
          const tag = this.uint32(end);
          if (tag < 0) return false;
          if ((tag & 7) === EGROUP) return true;
          if (!this.skip(tag & 7, end, depth + 1)) return false;
        }
      default:
        return false;
    }
  }
}
