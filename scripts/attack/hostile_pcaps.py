#!/usr/bin/env python3
"""Hostile captures for mcptap's sharded paths (an attacker's pass of 2026-12-05; written to
a file, never sent anywhere). Compare `mcptap replay --threads 1` with
`--threads 3 --flow-threads 2` and the worker path (`--worker-threads 1 --worker-flow-threads 2
--worker-session-threads 2`) on each: events, peak RSS (/usr/bin/time -v), summary counters.

usage: hostile_pcaps.py SCENARIO OUT [N]
  SCENARIO: synflood | hot | hugebody | clock | nontcp | trunc | tiny | rst_reuse"""
import struct, sys, random, json
random.seed(7)
SCEN, OUT = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 0
f = open(OUT, 'wb', buffering=1 << 20)
SNAP = 262144
f.write(struct.pack('<IHHiIII', 0xa1b2c3d4, 2, 4, 0, 0, SNAP, 1))
ETH = b'\x00\x11\x22\x33\x44\x55\x66\x77\x88\x99\xaa\xbb\x08\x00'
def rec(ts_ns, frame, orig=None, caplen=None):
    data = frame if caplen is None else frame[:caplen]
    s, us = divmod(ts_ns // 1000, 1000000)
    if s < 0: s, us = 0, 0
    f.write(struct.pack('<IIII', s, us, len(data), orig if orig is not None else len(frame)))
    f.write(data)
def ip4(a): return bytes(a)
def tcp_frame(src, sport, dst, dport, seq, ack, flags, payload=b''):
    tcp = struct.pack('>HHIIBBHHH', sport, dport, seq & 0xffffffff, ack & 0xffffffff, 0x50, flags, 65535, 0, 0)
    tot = 20 + 20 + len(payload)
    ip = struct.pack('>BBHHHBBH4s4s', 0x45, 0, tot & 0xffff, 0, 0x4000, 64, 6, 0, ip4(src), ip4(dst))
    return ETH + ip + tcp + payload
SYN, ACK, PSH, FIN, RST = 2, 16, 8, 1, 4
SERVER = (10, 0, 0, 1); SPORT = 8080
def req(method, id_, sid=None, params=None, body_pad=0):
    body = {"jsonrpc": "2.0", "id": id_, "method": method, "params": params or {}}
    if method == "initialize":
        body["params"] = {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}
    b = json.dumps(body).encode()
    if body_pad: b = b[:-1] + b',"pad":"' + b'A' * body_pad + b'"}'
    h = b'POST /mcp HTTP/1.1\r\nHost: s\r\naccept: application/json, text/event-stream\r\ncontent-type: application/json\r\n'
    if sid: h += b'mcp-session-id: ' + sid.encode() + b'\r\nmcp-protocol-version: 2025-03-26\r\n'
    return h + b'Content-Length: %d\r\n\r\n' % len(b) + b
def resp(id_, sid=None, init=False):
    r = {"jsonrpc": "2.0", "id": id_, "result": ({"protocolVersion": "2025-03-26", "capabilities": {"tools": {}}, "serverInfo": {"name": "s", "version": "1"}} if init else {"content": [{"type": "text", "text": "ok"}]})}
    b = json.dumps(r).encode()
    h = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n'
    if sid: h += b'mcp-session-id: ' + sid.encode() + b'\r\n'
    return h + b'content-length: %d\r\n\r\n' % len(b) + b
class Conn:
    def __init__(s, cli, cport, srv=SERVER, sport=SPORT):
        s.c, s.cp, s.s, s.sp = cli, cport, srv, sport
        s.cseq, s.sseq = random.getrandbits(32), random.getrandbits(32)
    def syn(s, t):
        rec(t, tcp_frame(s.c, s.cp, s.s, s.sp, s.cseq, 0, SYN)); 
        rec(t + 1000, tcp_frame(s.s, s.sp, s.c, s.cp, s.sseq, s.cseq + 1, SYN | ACK))
        s.cseq += 1; s.sseq += 1
        rec(t + 2000, tcp_frame(s.c, s.cp, s.s, s.sp, s.cseq, s.sseq, ACK))
    def send(s, t, data, from_client=True, mss=1400, caplen=None):
        for i in range(0, len(data), mss):
            ch = data[i:i + mss]
            if from_client:
                fr = tcp_frame(s.c, s.cp, s.s, s.sp, s.cseq, s.sseq, ACK | PSH, ch); s.cseq += len(ch)
            else:
                fr = tcp_frame(s.s, s.sp, s.c, s.cp, s.sseq, s.cseq, ACK | PSH, ch); s.sseq += len(ch)
            rec(t, fr, caplen=caplen); t += 10
        return t
    def fin(s, t):
        rec(t, tcp_frame(s.c, s.cp, s.s, s.sp, s.cseq, s.sseq, FIN | ACK)); s.cseq += 1
        rec(t + 1000, tcp_frame(s.s, s.sp, s.c, s.cp, s.sseq, s.cseq, FIN | ACK)); s.sseq += 1
        rec(t + 2000, tcp_frame(s.c, s.cp, s.s, s.sp, s.cseq, s.sseq, ACK))
def client(i): return (172, 16 + (i >> 16) % 16, (i >> 8) & 255, i & 255)
def session(c, t, i, calls=3, caplen=None):
    sid = 'sess%08d' % i
    c.syn(t); t += 5000
    t = c.send(t, req('initialize', 0), caplen=caplen); t = c.send(t + 100000, resp(0, sid, True), False, caplen=caplen)
    for k in range(1, calls + 1):
        t = c.send(t + 100000, req('tools/call', k, sid, {"name": "t", "arguments": {}}), caplen=caplen)
        t = c.send(t + 100000, resp(k), False, caplen=caplen)
    return t
T0 = 1_700_000_000 * 10**9
if SCEN == 'synflood':  # N SYNs over many ports to one server, with real sessions mixed in
    t = T0
    for i in range(N):
        cl = client(i % 4096); port = 1024 + (i * 7919) % 64000
        rec(t, tcp_frame(cl, port, SERVER, SPORT, random.getrandbits(32), 0, SYN)); t += 20000
        if i % 2000 == 0:
            c = Conn(client(70000 + i // 2000), 50000); t = session(c, t, i // 2000); c.fin(t); t += 10000
elif SCEN == 'hot':  # one connection, N exchanges, keep-alive; a few idle conns elsewhere
    t = T0
    for j in range(5):
        c = Conn(client(900 + j), 40000 + j); t = session(c, t, 900000 + j, 1); c.fin(t)
    c = Conn(client(1), 33333); t = session(c, t, 1, N)
    c.fin(t)
elif SCEN == 'hugebody':  # one request with an N-MiB body (over max-message) and sessions around
    t = T0
    c = Conn(client(1), 33333); t = session(c, t, 1, 2)
    t = c.send(t, req('tools/call', 99, 'sess00000001', {"name": "t"}, body_pad=N << 20))
    t = c.send(t + 1000, resp(99), False)
    for k in range(100, 110):
        t = c.send(t + 1000, req('tools/call', k, 'sess00000001', {"name": "t"})); t = c.send(t + 1000, resp(k), False)
    c.fin(t)
    for j in range(50):
        c = Conn(client(900 + j), 40000 + j); t = session(c, t + 1000, 900000 + j, 1); c.fin(t)
elif SCEN == 'clock':  # timestamps backwards / far ahead repeatedly, across many conns
    t = T0
    for i in range(N):
        c = Conn(client(i), 20000 + i % 40000)
        base = t
        te = session(c, t, i, 2); c.fin(te)
        t = te + 1000000
        m = i % 10
        if m == 3: rec(t + 10**9 * 86400 * 365, tcp_frame(client(i), 1, SERVER, SPORT, 1, 0, SYN))  # lone far-future
        if m == 5:  # three agreeing jumps: clock follows far ahead; the rest of the capture is "behind"
            for k in range(3): rec(t + 10**9 * 3600 * (1 + i // 10) + k, tcp_frame(client(i), 2 + k, SERVER, SPORT, 1, 0, SYN))
        if m == 7: t -= 10**9 * 600  # step backwards 10 min
        if m == 9: t += 10**9 * 400  # idle gap: every flow sweeps
elif SCEN == 'nontcp':
    t = T0
    for i in range(N):
        k = i % 6
        if k == 0:  # UDP
            ip = struct.pack('>BBHHHBBH4s4s', 0x45, 0, 28 + 8, 0, 0, 64, 17, 0, ip4(client(i)), ip4(SERVER))
            rec(t, ETH + ip + struct.pack('>HHHH', 53, 53, 16, 0) + b'x' * 8)
        elif k == 1:  # ARP
            rec(t, ETH[:12] + b'\x08\x06' + b'\x00' * 28)
        elif k == 2:  # IP fragment carrying TCP header of a real conn
            ip = struct.pack('>BBHHHBBH4s4s', 0x45, 0, 60, 1, 0x2000, 64, 6, 0, ip4(client(i)), ip4(SERVER))
            rec(t, ETH + ip + struct.pack('>HHIIBBHHH', 20000, SPORT, 1, 0, 0x50, 2, 1, 0, 0) + b'y' * 20)
        elif k == 3:  # garbage / short
            rec(t, b'\x01\x02')
        elif k == 4:  # IPv6 with unknown next header
            rec(t, ETH[:12] + b'\x86\xdd' + struct.pack('>IHBB', 0x60000000, 8, 59, 64) + b'\x00' * 32 + b'z' * 8)
        else:
            c = Conn(client(i), 20000 + i % 40000); te = session(c, t, i, 1); c.fin(te); t = te
        t += 50000
elif SCEN == 'trunc':  # sessions captured with snaplen 96 and 60
    t = T0
    for i in range(N):
        c = Conn(client(i), 20000 + i % 40000)
        te = session(c, t, i, 2, caplen=(96 if i % 2 else 60) if i % 3 else None); c.fin(te); t = te + 1000
elif SCEN == 'tiny':  # N tiny connections: each one exchange with its own session id (stateless-ish)
    t = T0
    for i in range(N):
        c = Conn(client(i), 1024 + i % 60000)
        c.syn(t); t += 3000
        sid = 'sess%08d' % (i % 50000)
        t = c.send(t, req('tools/call', i, sid, {"name": "t"})); t = c.send(t + 1000, resp(i), False)
        c.fin(t); t += 4000
elif SCEN == 'rst_reuse':  # same 4-tuple reused many times, RST mid-stream, ports hashed to one shard
    t = T0
    for i in range(N):
        c = Conn(client(1), 40000)
        t = session(c, t, i % 1000, 1)
        if i % 2: rec(t, tcp_frame(c.c, c.cp, c.s, c.sp, c.cseq, 0, RST))
        else: c.fin(t)
        t += 5000
f.close()
