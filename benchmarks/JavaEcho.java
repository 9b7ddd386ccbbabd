// JavaEcho: 64-byte round trips over blocking java.net sockets, the JVM row
// of `make bench` (benchmarks/apps.sh). Plain java.net, so that it runs the
// same with and without librsock.
//
//   java JavaEcho server PORT
//       accepts one connection on 127.0.0.1:PORT and echoes every 64-byte
//       message (blocking InputStream.read / OutputStream.write) until EOF.
//       Prints READY once listening.
//   java JavaEcho client PORT ROUNDS
//       connects, sends 64 bytes and reads them back ROUNDS times after
//       2,000 rounds of warm-up (the JIT compiles the loop), checking every
//       byte. Prints "RESULT rounds=N p50_us=P p99_us=Q" (one round trip
//       each) and exits 0, or exits 1 on a short or wrong answer.
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.Arrays;

public class JavaEcho {
  static final int SIZE = 64;
  static final int WARMUP = 2000;

  // Reads exactly SIZE bytes; false at EOF.
  static boolean readFull(InputStream in, byte[] b) throws IOException {
    for (int got = 0; got < SIZE; ) {
      int r = in.read(b, got, SIZE - got);
      if (r <= 0) return false;
      got += r;
    }
    return true;
  }

  public static void main(String[] args) throws Exception {
    int port = Integer.parseInt(args[1]);
    InetAddress lo = InetAddress.getByName("127.0.0.1");
    byte[] buf = new byte[SIZE];
    if (args[0].equals("server")) {
      try (ServerSocket ss = new ServerSocket(port, 16, lo)) {
        System.out.println("READY");
        System.out.flush();
        try (Socket s = ss.accept()) {
          s.setTcpNoDelay(true);
          InputStream in = s.getInputStream();
          OutputStream out = s.getOutputStream();
          while (readFull(in, buf)) out.write(buf, 0, SIZE);
        }
      }
      return;
    }
    int rounds = Integer.parseInt(args[2]);
    long[] rtt = new long[rounds];
    byte[] msg = new byte[SIZE];
    try (Socket s = new Socket(lo, port)) {
      s.setTcpNoDelay(true);
      s.setSoTimeout(10000);
      InputStream in = s.getInputStream();
      OutputStream out = s.getOutputStream();
      for (int i = 0; i < WARMUP + rounds; i++) {
        Arrays.fill(msg, (byte) i);
        long t0 = System.nanoTime();
        out.write(msg, 0, SIZE);
        if (!readFull(in, buf) || !Arrays.equals(buf, msg)) {
          System.err.println("round " + i + ": short or wrong answer");
          System.exit(1);
        }
        if (i >= WARMUP) rtt[i - WARMUP] = System.nanoTime() - t0;
      }
    }
    Arrays.sort(rtt);
    System.out.printf("RESULT rounds=%d p50_us=%.2f p99_us=%.2f%n", rounds, rtt[rounds / 2] / 1e3,
        rtt[rounds * 99 / 100] / 1e3);
  }
}
