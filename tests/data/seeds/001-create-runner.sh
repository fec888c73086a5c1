hctl create runner ${RUNNER_ID} \
  [email protected]
