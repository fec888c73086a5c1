cat <<EOF > runner-config.yaml
runner_configuration:
  type: kubernetes
  cluster:
    cluster_data:
      certificate_authority_data: $(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' --raw)
      server: $(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}' --raw)
    auth:
      client_certificate_data: $(kubectl config view --minify -o jsonpath='{.users[0].user.client-certificate-data}' --raw)
      client_key_data: $(kubectl config view --minify -o jsonpath='{.users[0].user.client-key-data}' --raw)
  job:
    namespace: ${RUNNER_K8S_NAMESPACE}
    service_account: ${RUNNER_K8S_SA}
EOF
