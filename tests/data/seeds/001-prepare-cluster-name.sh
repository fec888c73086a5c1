export CLUSTER_NAME=<my-cluster-name>
