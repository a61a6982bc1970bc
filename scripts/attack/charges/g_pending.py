# Candidate B: HTTP PendingRequests VecDeque keeps its capacity after it drains
import sys,random; sys.path.insert(0, __import__('os').path.dirname(__file__)); from pc import *
random.seed(2); out,N,R,mode=sys.argv[1],int(sys.argv[2]),int(sys.argv[3]),sys.argv[4]
p=P(out)
for c in range(N):
    k=Conn(p,c)
    k.c2s(b'GET / HTTP/1.1\r\n\r\n'*R, mss=60000)
    if mode=='resp': k.s2c(b'HTTP/1.1 204 No Content\r\n\r\n'*R, mss=60000)
    elif mode=='junk': k.c2s(b'\x01\x02junk\r\n\r\n')
    k.ack()
p.close()
