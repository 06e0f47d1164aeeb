// Prints, for each line of stdin (a record key in UTF-8), the partition the Java producer's default
// partitioner picks for a record with that key: BuiltInPartitioner.partitionForKey, which is
// Utils.toPositive(Utils.murmur2(key)) % partitions (checked here too).
// Run: java -cp '<kafka lib>/*' sink/testdata/Murmur2.java <partitions>
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import org.apache.kafka.common.utils.Utils;

public class Murmur2 {
    public static void main(String[] args) throws Exception {
        int partitions = Integer.parseInt(args[0]);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        StringBuilder out = new StringBuilder();
        for (String key; (key = in.readLine()) != null; ) {
            byte[] bytes = key.getBytes(StandardCharsets.UTF_8);
            int p = BuiltInPartitioner.partitionForKey(bytes, partitions);
            if (p != Utils.toPositive(Utils.murmur2(bytes)) % partitions) {
                throw new IllegalStateException("partitionForKey disagrees with murmur2 for " + key);
            }
            out.append(p).append('\n');
        }
        System.out.print(out);
    }
}
