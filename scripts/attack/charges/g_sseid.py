# Candidate E: SSE parser's event_type / id buffers keep their capacity after a long field, and
# the spare parser kept between responses is charged only for partial_line + data (retained_bytes)
import sys,random,json; sys.path.insert(0, __import__('os').path.dirname(__file__)); from pc import *
random.seed(5); out,N,F=sys.argv[1],int(sys.argv[2]),int(sys.argv[3])
p=P(out)
body=json.dumps({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}).encode()
for c in range(N):
    k=Conn(p,c)
    req=b'POST /mcp HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n'%len(body)+body
    k.c2s(req)
    sse=b'event: '+b'e'*F+b'\n\n'+b'id: '+b'i'*F+b'\n\n'
    k.s2c(b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n'%len(sse)+sse, mss=32000)
    k.ack()
p.close()
