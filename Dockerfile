# Builds the idem-operator image: `docker build -t idem-operator:0.1.0 .`
FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p idem-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/idem-operator /usr/local/bin/idem-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/idem-operator"]
CMD ["run"]
