import { describe, expect, test } from "bun:test";
import { bracketHost, endpointHost, formatEndpoint, hostPort, parseEndpoint, publisherBinds, rankEndpoint } from "../src/index.ts";

describe("host:port", () => {
  test("an endpoint's host: the port dropped, an IPv6 host unbracketed (with or without its port)", () => {
    expect(endpointHost("10.0.0.1:8000")).toBe("10.0.0.1");
    expect(endpointHost("10.0.0.1")).toBe("10.0.0.1");
    expect(endpointHost("[fd00::1]:8000")).toBe("fd00::1");
    expect(endpointHost("[fd00::1]")).toBe("fd00::1");
    expect(endpointHost("fd00::1")).toBe("fd00::1");
  });

  test("brackets an IPv6 host once, leaves names and IPv4 alone", () => {
    expect(hostPort("10.0.0.2", 80)).toBe("10.0.0.2:80");
    expect(hostPort("epp.ns.svc", 9002)).toBe("epp.ns.svc:9002");
    expect(hostPort("fd00::2", 80)).toBe("[fd00::2]:80");
    expect(bracketHost("[::1]")).toBe("[::1]");
    expect(formatEndpoint("::1", 5557)).toBe("tcp://[::1]:5557");
  });
});

describe("tcp endpoints", () => {
  test("parse wildcard hosts and ports, IPv6 and reject the rest", () => {
    expect(parseEndpoint("tcp://*:5557")).toEqual({ host: "0.0.0.0", port: 5557 });
    expect(parseEndpoint("tcp://127.0.0.1:*")).toEqual({ host: "127.0.0.1", port: 0 });
    expect(parseEndpoint("tcp://[::1]:9")).toEqual({ host: "::1", port: 9 });
    expect(() => parseEndpoint("ipc:///tmp/x")).toThrow(/expected tcp/);
    expect(() => parseEndpoint("tcp://h:70000")).toThrow(/out of range/);
  });
  test("rank r of a data-parallel worker publishes on the base port + r; rank 0 and ephemeral ports stay", () => {
    expect(rankEndpoint("tcp://10.0.0.2:5557", 3)).toBe("tcp://10.0.0.2:5560");
    expect(rankEndpoint("tcp://[fd00::2]:5557", 1)).toBe("tcp://[fd00::2]:5558");
    expect(rankEndpoint("tcp://*:5557", 0)).toBe("tcp://*:5557");
    expect(rankEndpoint("tcp://127.0.0.1:0", 2)).toBe("tcp://127.0.0.1:0");
    expect(rankEndpoint("tcp://127.0.0.1:*", 2)).toBe("tcp://127.0.0.1:*");
    expect(rankEndpoint("ipc:///tmp/x", 0)).toBe("ipc:///tmp/x");
    expect(() => rankEndpoint("ipc:///tmp/x", 1)).toThrow(/no port/);
  });
});

describe("the engines' publisher rule", () => {
  test("binds a wildcard (0.0.0.0 too), ipc or inproc endpoint and connects to any other (an IPv6 literal with :: counts as a wildcard, as in vLLM)", () => {
    expect(publisherBinds("tcp://*:5557")).toBe(true);
    // SGLang binds 0.0.0.0 too (the bind-all address its /server_info advertises, and ZMQ reports a * bind as);
    // vLLM would connect to its own host there, where no subscriber in another pod can be.
    expect(publisherBinds("tcp://0.0.0.0:5557")).toBe(true);
    expect(publisherBinds("tcp://[::]:5557")).toBe(true);
    expect(publisherBinds("tcp://[fd00::2]:5557")).toBe(true);
    expect(publisherBinds("ipc:///tmp/kv")).toBe(true);
    expect(publisherBinds("inproc://kv")).toBe(true);
    expect(publisherBinds("tcp://10.0.0.5:5557")).toBe(false);
    expect(publisherBinds("tcp://dynamo-epp.llm.svc:5557")).toBe(false);
  });
});
