# Candidate I: detection state per session (ModeTracker: up to 64 method names, each as long as the
# wire sent it) is covered only by the flat 768 bytes in session fixed_cost. One gzip'd batch of
# 64 requests with ~58 KB method names per session, answered 200 JSON.
import sys,random,json,zlib,string; sys.path.insert(0, __import__('os').path.dirname(__file__)); from pc import *
random.seed(9); out,N,L=sys.argv[1],int(sys.argv[2]),int(sys.argv[3])
def gz(data,pad):
    h=b'\x1f\x8b\x08\x04\0\0\0\0\0\xff'+pad.to_bytes(2,'little')+random.randbytes(pad)
    c=zlib.compressobj(9,zlib.DEFLATED,-15); d=c.compress(data)+c.flush()
    return h+d+(zlib.crc32(data)&0xffffffff).to_bytes(4,'little')+(len(data)&0xffffffff).to_bytes(4,'little')
def name(L):  # ~160:1 deflate ratio, under the 200x-per-input-slice guard
    return b''.join(b'a'*800+''.join(random.choice(string.ascii_lowercase) for _ in range(3)).encode() for _ in range(L//803))
p=P(out)
for c in range(N):
    k=Conn(p,c)
    batch=b'['+b','.join(b'{"jsonrpc":"2.0","id":%d,"method":"m%d_%d_%s"}'%(i,c,i,name(L)) for i in range(64))+b']'
    body=gz(batch,100)
    k.c2s(b'POST /mcp HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nMcp-Session-Id: s%d\r\nContent-Length: %d\r\n\r\n'%(c,len(body))+body, mss=60000)
    resp=b'['+b','.join(b'{"jsonrpc":"2.0","id":%d,"result":{}}'%i for i in range(64))+b']'
    k.s2c(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n'%len(resp)+resp)
    p.rec(tcp(k.C,k.cp,S,k.sp,k.cs,k.ss,17)); k.cs+=1
    p.rec(tcp(S,k.sp,k.C,k.cp,k.ss,k.cs,17)); k.ss+=1
    k.ack()
p.close()
