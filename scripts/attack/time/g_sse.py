# A chunked SSE answer whose events have one long line of L bytes (a data line, or an event
# type line), sent STEP bytes per segment, each segment its own chunk with a zero-padded
# chunk-size line (PAD digits). usage: g_sse.py OUT L EVENTS STEP field [PAD]
import sys, os, random; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
random.seed(11); out, L, E, STEP, field = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].encode()
PAD = int(sys.argv[6]) if len(sys.argv) > 6 else 1
p = P(out); k = Conn(p, 1)
body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}'
k.c2s(b'POST /mcp HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: s1\r\nContent-Length: %d\r\n\r\n' % len(body) + body)
k.s2c(b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n')
ev = b''
for e in range(E):
    line = field + b': ' + (b'x' * L if field != b'data' else b'"' + b'x' * L + b'"')
    ev += line + b'\n\n'
for i in range(0, len(ev), STEP):
    piece = ev[i:i + STEP]
    k.s2c(b'%0*x\r\n' % (PAD, len(piece)) + piece + b'\r\n')
k.s2c(b'0\r\n\r\n')
p.close()
